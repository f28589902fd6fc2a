"""gem_dependencies(): everything another Bazel workspace needs to depend on @gem//<module>.

In the other workspace's WORKSPACE:

    local_repository(name = "gem", path = "/path/to/gem")   # or http_archive / git_repository
    load("@gem//tools:deps.bzl", "gem_dependencies")
    gem_dependencies()

and then `deps = ["@gem//kernels"]` in a py_library / py_test. This workspace's own WORKSPACE
calls the same macro, so the two cannot drift apart.

It defines:
- `rules_cc`, `rules_java`, `remote_coverage_tools`: offline stand-ins for the three
  repositories Bazel 4.2.3 would otherwise download (Debian's bazel-bootstrap has no network
  fetcher for them). Pass `offline_standins = False` with a newer Bazel that has network.
  Call the macro before anything that loads from rules_cc or rules_java.
- `gem_python` + its registered toolchain: a py_runtime whose interpreter is `python`
  (an absolute path to a Python 3.11 with torch and triton), by default the `.venv` that
  `./bazelw` builds inside the gem checkout. Pass `register_python = False` to keep your own
  Python toolchain.
"""

load("//tools:python.bzl", "venv_python")

_STANDINS = ["rules_cc", "rules_java", "remote_coverage_tools"]

def _standin_impl(rctx):
    # The stand-in sources live in tools/standins/<name>/ of the gem checkout; each holds its
    # own WORKSPACE, so it is not a package of @gem and cannot be named by a label. Locate it
    # from this file's label (which resolves inside @gem even when loaded from elsewhere).
    src = rctx.path(Label("//tools:deps.bzl")).dirname.get_child("standins").get_child(rctx.attr.standin)
    if not src.exists:
        fail("gem stand-in %s not found at %s" % (rctx.attr.standin, src))
    for entry in src.readdir():
        rctx.symlink(entry, entry.basename)

_standin = repository_rule(
    implementation = _standin_impl,
    attrs = {"standin": attr.string(mandatory = True)},
    local = True,
)

def gem_dependencies(offline_standins = True, register_python = True, python = ""):
    """Defines the repositories and toolchain that @gem's BUILD files need.

    Args:
      offline_standins: define the rules_cc / rules_java / remote_coverage_tools stand-ins
        (needed by an offline Bazel 4.2.3; drop them with a newer Bazel that has network).
      register_python: define @gem_python and register it as the Python toolchain.
      python: absolute path of the interpreter for @gem_python; "" = the gem checkout's .venv.
    """
    if offline_standins:
        for name in _STANDINS:
            if not native.existing_rule(name):
                _standin(name = name, standin = name)
    if register_python:
        venv_python(name = "gem_python", interpreter = python)
        native.register_toolchains("@gem_python//:toolchain")
