"""`mypy --strict` over one gem package (a Bazel test). Args: the package name."""
import os
import sys

from mypy import api

if __name__ == "__main__":
    pkgs = sys.argv[1:]
    # One cache shared by every module's mypy test (outside the sandbox's per-test tmp):
    # analysing torch's stubs dominates a cold run, and it is the same for all modules.
    cache = os.environ.get("GEM_MYPY_CACHE") or f"/tmp/gem-mypy-cache-{os.getuid()}"
    try:
        os.makedirs(cache, exist_ok=True)
    except OSError:
        cache = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "mypy_cache")
    # Each module folder is an import root (py_library imports = ["."]).
    roots = [p for p in sys.path if os.path.isdir(p) and any(
        os.path.isdir(os.path.join(p, d)) and d.startswith("gem_") for d in os.listdir(p))]
    os.environ["MYPYPATH"] = os.pathsep.join(roots)
    argv = ["--config-file", "mypy.ini", "--cache-dir", cache, "--strict"]
    for p in pkgs:
        argv += ["-p", p]
    out, err, rc = api.run(argv)
    sys.stdout.write(out)
    sys.stderr.write(err)
    sys.exit(rc)
