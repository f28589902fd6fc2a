"""The one macro file: a module's library, tests, benches and type check.

A module folder `<m>/` holds `gem_<m>/` (the package), `tests/test_*.py`,
`gem_<m>/bench/*.py` and `pyproject.toml`. In `<m>/BUILD`:

    load("//tools:defs.bzl", "gem_module")
    gem_module(name = "data", deps = [], test_deps = [], benches = ["loader"])

makes `//data` (py_library), one py_test per tests/test_*.py (pytest inside),
`//data:mypy_test` (mypy --strict), `//data:version_test` and `//data:bench_<b>`
(py_binary, tagged manual). `deps` are other gem modules (labels such as
"//kernels"); Bazel visibility enforces DESIGN.md's dependency direction.
"""

# DESIGN.md §2's dependency direction, enforced at load time: a module may declare (as deps
# or test_deps) only the modules listed here. Leaves reach only torch/triton/torchrec/fbgemm.
ALLOWED_DEPS = {
    "kernels": [],
    "precision": [],
    "comms": [],
    "data": [],
    "checkpoint": [],
    "model": ["kernels", "precision", "data"],  # precision, data: test_deps only (the library imports kernels alone)
    "parallel": ["comms", "precision"],
    "transfer": ["model", "data"],
    "trainer": ["kernels", "precision", "comms", "data", "checkpoint", "model", "parallel", "transfer"],
}

# Who may depend on a module's library inside this workspace. Leaves stay public so another
# workspace can depend on @gem//kernels etc.; composite modules are internal to their users.
_INTERNAL_USERS = {
    "model": ["//trainer:__pkg__", "//tests:__pkg__", "//transfer:__pkg__"],
    "parallel": ["//trainer:__pkg__", "//tests:__pkg__"],
    "transfer": ["//trainer:__pkg__", "//tests:__pkg__"],
    "trainer": ["//trainer:__pkg__", "//tests:__pkg__"],
}

def _check_deps(name, labels):
    allowed = ALLOWED_DEPS.get(name)
    if allowed == None:
        fail("gem_module(name = %r): add it to ALLOWED_DEPS in tools/defs.bzl" % name)
    for label in labels:
        dep = label.lstrip("/").split(":")[0]
        if dep not in allowed:
            fail("//%s may not depend on %s (DESIGN.md dependency direction; allowed: %s)" % (name, label, allowed))

def _pkg(name):
    return "gem_" + name

def gem_module(
        name,
        deps = [],
        test_deps = [],
        benches = [],
        test_data = [],
        test_size = "medium",
        large_tests = [],
        visibility = None,
        mypy_modules = None):
    pkg = _pkg(name)
    _check_deps(name, deps + test_deps)
    native.exports_files(["README.md"], visibility = ["//tests:__pkg__"])  # its examples run in //tests
    if visibility == None:
        visibility = _INTERNAL_USERS.get(name, ["//visibility:public"])
    native.py_library(
        name = name,
        srcs = native.glob([pkg + "/**/*.py"], exclude = [pkg + "/bench/**"]),
        data = native.glob([pkg + "/**/*.json", pkg + "/**/*.txt"]),
        imports = ["."],
        deps = deps,
        visibility = visibility,
    )

    for src in native.glob(["tests/test_*.py"]):
        tname = src[len("tests/"):-len(".py")]
        native.py_test(
            name = tname,
            srcs = ["//tools:pytest_main.py", src] + native.glob(["tests/conftest.py", "tests/_*.py"]),
            main = "//tools:pytest_main.py",
            args = ["$(location %s)" % src],
            data = test_data + ["pyproject.toml"],
            deps = [":" + name] + test_deps,
            size = "large" if tname in large_tests else test_size,
            python_version = "PY3",
        )

    native.py_test(
        name = "mypy_test",
        srcs = ["//tools:mypy_main.py"],
        main = "//tools:mypy_main.py",
        args = [pkg] + (mypy_modules or []),
        data = ["//:mypy.ini"],
        deps = [":" + name],
        size = "medium",
        python_version = "PY3",
    )

    native.py_test(
        name = "version_test",
        srcs = ["//tools:version_check.py"],
        main = "//tools:version_check.py",
        args = [name],
        data = ["pyproject.toml"],
        deps = [":" + name],
        size = "small",
        python_version = "PY3",
    )

    for b in benches:
        native.py_binary(
            name = "bench_" + b,
            srcs = [pkg + "/bench/%s.py" % b] + native.glob([pkg + "/bench/_*.py", pkg + "/bench/__init__.py"]),
            main = pkg + "/bench/%s.py" % b,
            deps = [":" + name] + test_deps,
            tags = ["manual"],
            python_version = "PY3",
        )
