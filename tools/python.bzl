"""A Python toolchain whose interpreter is the project venv (.venv), or a given interpreter.

Bazel 4.2.3's native py_runtime accepts interpreter_path and stub_shebang; pointing
both at the venv makes `bazel test` and `bazel run` use the same interpreter.
Used through gem_dependencies() in tools/deps.bzl.
"""

def _venv_python_impl(rctx):
    py = rctx.attr.interpreter
    if not py:
        # Label("//:BUILD") names the gem checkout's root even when another workspace loads
        # this file, so the default is the .venv that ./bazelw builds there.
        # realpath: in another workspace the label resolves through external/gem, a symlink.
        py = "%s/.venv/bin/python3" % rctx.path(Label("//:BUILD")).realpath.dirname
    if not py.startswith("/"):
        fail("gem_dependencies(python = %r): must be an absolute path to a Python interpreter" % py)
    if not rctx.path(py).exists:
        fail(("gem_python: interpreter %s does not exist. Run ./bazelw once in the gem " +
              "checkout to build its .venv, or pass gem_dependencies(python = \"/abs/python3\") " +
              "with torch and triton installed.") % py)
    rctx.file("BUILD", """
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")
py_runtime(
    name = "py3",
    interpreter_path = "{py}",
    python_version = "PY3",
    stub_shebang = "#!{py}",
)
py_runtime_pair(name = "pair", py3_runtime = ":py3")
toolchain(
    name = "toolchain",
    toolchain = ":pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
""".format(py = py))

venv_python = repository_rule(
    implementation = _venv_python_impl,
    attrs = {"interpreter": attr.string(default = "")},
    local = True,
)
