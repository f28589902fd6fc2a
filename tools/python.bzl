"""A Python toolchain whose interpreter is the project venv (.venv).

Bazel 4.2.3's native py_runtime accepts interpreter_path and stub_shebang; pointing
both at the venv makes `bazel test` and `bazel run` use the same interpreter.
"""

def _venv_python_impl(rctx):
    root = rctx.path(Label("//:BUILD")).dirname
    py = "%s/.venv/bin/python3" % root
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

venv_python = repository_rule(implementation = _venv_python_impl, local = True)
