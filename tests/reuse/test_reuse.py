"""Reuse as promised: every module installs with pip on its own, and @gem works from another
Bazel workspace.

Run outside Bazel (it runs pip and a second Bazel itself), after the main test command in
.ci/run, or by hand:

    .venv/bin/python -m pytest -q tests/reuse/test_reuse.py

Offline and fast (about a minute on 2 cores). Why the venvs look the way they do:
- Each module gets its own fresh `python -m venv --without-pip` (pip runs from the project
  venv through `pip --python`), so no gem module and no undeclared package is visible in it.
- Third-party packages cannot come from a registry here (offline, and pip must never resolve
  torch: that pulls a multi-GB CUDA build). Instead the venv sees a *view* of the project venv
  (.venv, built from requirements.lock): a directory of symlinks to exactly the distributions
  the module declares, through its gem dependencies, plus their own requirements. One `.pth`
  line puts the view on sys.path. A package the module imports without declaring it is absent
  from the view, so the import fails here as it would for a pip user. A plain
  `--system-site-packages` venv would show everything in .venv and prove nothing.
- The wheels are built once from copies of the module folders (`pip wheel --no-build-isolation
  <path>`, as `pip install ./<module>` builds them). `pip install --no-index --find-links
  <those wheels> gem-<module>` is then what a user runs, minus the registry: gem dependencies
  resolve from the local wheels only if declared, and a range that the locked version does
  not satisfy (e.g. a triton bound) fails the install instead of pulling another version.
"""
from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(p.parent.name for p in ROOT.glob("*/pyproject.toml") if (p.parent / f"gem_{p.parent.name}").is_dir())
VENV_PY = Path(sys.executable)
# Import names whose distribution name differs from the name, or that the lock installs under
# a CPU variant name: any of the listed distributions satisfies the import.
# flash_attn.cute (gem_kernels._flash4) comes with the flash-attn-4 distribution (flash-attn 2.x has no cute)
ALIASES = {"fbgemm_gpu": {"fbgemm-gpu", "fbgemm-gpu-cpu"}, "yaml": {"pyyaml"}, "flash_attn": {"flash-attn-4"}}
# Triton must pair with the installed torch (inductor and Triton move together), so pip may
# not pick a newer one than the lock pins; the GPU box runs torch 2.11 with triton 3.6.0.
TRITON_MUST_ADMIT = ["3.6.0"]


def _pyproject(module: str) -> dict[str, Any]:
    with open(ROOT / module / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _requirements(module: str, extras: bool) -> list[Requirement]:
    proj = _pyproject(module)["project"]
    reqs = [Requirement(r) for r in proj.get("dependencies", [])]
    if extras:
        for group in proj.get("optional-dependencies", {}).values():
            reqs += [Requirement(r) for r in group]
    return reqs


def _lock() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        m = re.match(r"\s*([A-Za-z0-9_.-]+)==([^\s#]+)", line)
        if m:
            pins[canonicalize_name(m.group(1))] = Version(m.group(2))
    return pins


def _gem_closure(module: str) -> list[str]:
    """The module and the gem modules it declares, transitively (hard dependencies only)."""
    seen: list[str] = []
    todo = [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.append(m)
        todo += [r.name[len("gem-"):] for r in _requirements(m, extras=False) if r.name.startswith("gem-")]
    return seen


def _imports(module: str) -> dict[str, list[str]]:
    """Top-level names the package's library code imports (bench/ excluded) -> where.

    Counts `import x`, `from x import y` and `importlib.import_module("x")` with a literal.
    """
    found: dict[str, list[str]] = {}
    pkg = ROOT / module / f"gem_{module}"
    for path in sorted(pkg.rglob("*.py")):
        if "bench" in path.relative_to(pkg).parts:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
                  and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                names = [node.args[0].value]
            for n in names:
                top = n.split(".")[0]
                if top != f"gem_{module}" and top not in sys.stdlib_module_names and top != "__future__":
                    found.setdefault(top, []).append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}")
    return found


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    return dict(md.packages_distributions())


def _dists_of(import_name: str) -> set[str]:
    if import_name.startswith("gem_"):
        return {"gem-" + import_name[len("gem_"):]}
    if import_name in ALIASES:
        return ALIASES[import_name]
    return {canonicalize_name(d) for d in _packages_distributions().get(import_name, [import_name])}


# ---------------------------------------------------------------------------------------------
# Static checks: declarations against the code and the lock.


@pytest.mark.parametrize("module", MODULES)
def test_imports_are_declared(module: str) -> None:
    """Every gem module the code imports is a dependency; every other package at least an extra."""
    hard = {canonicalize_name(r.name) for r in _requirements(module, extras=False)}
    every = {canonicalize_name(r.name) for r in _requirements(module, extras=True)}
    problems = []
    for name, where in sorted(_imports(module).items()):
        dists = _dists_of(name)
        pool = hard if name.startswith("gem_") else every
        if not dists & pool:
            kind = "dependencies" if name.startswith("gem_") else "dependencies or optional-dependencies"
            problems.append(f"{module}/pyproject.toml: `{name}` is imported ({where[0]}) but none of "
                            f"{sorted(dists)} is in [project] {kind}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("module", MODULES)
def test_ranges_admit_the_lock(module: str) -> None:
    """A declared range holds the version requirements.lock pins; triton's stops at the pin."""
    pins = _lock()
    problems = []
    for req in _requirements(module, extras=True):
        pin = pins.get(canonicalize_name(req.name))
        if pin is not None and not req.specifier.contains(pin, prereleases=True):
            problems.append(f"{module}: `{req}` excludes the locked {req.name}=={pin}")
        if canonicalize_name(req.name) == "triton":
            nxt = Version(f"{pin.major}.{pin.minor}.{pin.micro + 1}") if pin else None
            if nxt is not None and req.specifier.contains(nxt):
                problems.append(f"{module}: `{req}` admits triton {nxt}, newer than the locked {pin}: "
                                f"pip would pull it; bound it at <={pin}")
            for v in TRITON_MUST_ADMIT:
                if not req.specifier.contains(v):
                    problems.append(f"{module}: `{req}` excludes triton {v} (torch 2.11's Triton)")
        if canonicalize_name(req.name) == "torch" and not req.specifier.contains("2.11.0"):
            problems.append(f"{module}: `{req}` excludes torch 2.11 (the GPU box)")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("module", MODULES)
def test_build_backend_is_in_the_venv(module: str) -> None:
    """`--no-build-isolation` builds with the project venv's backend: it must satisfy build-system."""
    build = _pyproject(module)["build-system"]
    assert build["build-backend"] == "setuptools.build_meta", build
    for r in build["requires"]:
        req = Requirement(r)
        have = md.version(req.name)
        assert req.specifier.contains(have), f"{module}: build-system requires `{req}`, .venv has {have}"


# ---------------------------------------------------------------------------------------------
# pip: each module into its own clean venv.


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
    env["PYTHONNOUSERSITE"] = "1"
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Copies of the module sources (pip builds in the tree) and a wheel of each."""
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.fail(f"run this with the project venv ({ROOT}/.venv/bin/python, built by ./bazelw): the clean "
                    f"venvs borrow its packages; this is {sys.prefix}")
    base = tmp_path_factory.mktemp("pip")
    for m in MODULES:
        shutil.copytree(ROOT / m, base / "src" / m, ignore=shutil.ignore_patterns(
            "__pycache__", "tests", "*.egg-info", "build", "dist"))
    out = _run([str(VENV_PY), "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                "--disable-pip-version-check", "-w", str(base / "wh"), *[str(base / "src" / m) for m in MODULES]],
               cwd=base)
    assert out.returncode == 0, out.stdout + out.stderr
    return base


def _third_party_view(module: str, dest: Path) -> set[str]:
    """Symlinks to the .venv distributions that `module` needs (declared, then their requires)."""
    todo = [r for m in _gem_closure(module) for r in _requirements(m, extras=False) if not r.name.startswith("gem-")]
    seen: set[str] = set()
    dest.mkdir(parents=True)
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        dist = md.distribution(req.name)  # PackageNotFoundError: declared but not in the lock
        todo += [Requirement(r) for r in dist.requires or []]
        site = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            if (site / top).exists() and not (dest / top).exists():
                (dest / top).symlink_to(site / top)
    return seen


@pytest.mark.parametrize("module", MODULES)
def test_pip_install_into_clean_venv(module: str, wheelhouse: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    py = venv / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path).stdout.strip())
    view = tmp_path / "view"
    _third_party_view(module, view)
    (site / "gem_lock_view.pth").write_text(f"{view}\n")

    out = _run([str(VENV_PY), "-m", "pip", "--python", str(py), "install", "-q", "--no-index",
                "--no-build-isolation", "--disable-pip-version-check", "--find-links", str(wheelhouse / "wh"),
                f"gem-{module}"], cwd=tmp_path)
    assert out.returncode == 0, f"pip install ./{module} failed offline:\n{out.stdout}{out.stderr}"

    # Import the package and every gem module its code refers to, from outside any checkout.
    names = [f"gem_{module}"] + sorted(n for n in _imports(module) if n.startswith("gem_"))
    probe = textwrap.dedent(f"""
        import importlib, sys
        for n in {names!r}:
            m = importlib.import_module(n)
            assert m.__file__.startswith({str(site)!r}), (n, m.__file__)
        print("ok", {names!r})
    """)
    got = _run([str(py), "-c", probe], cwd=tmp_path)
    assert got.returncode == 0, f"in a clean venv with only `pip install ./{module}`:\n{got.stdout}{got.stderr}"


# ---------------------------------------------------------------------------------------------
# Bazel: another workspace depends on @gem//kernels and @gem//precision.

_USER_WORKSPACE = """\
workspace(name = "user")

local_repository(name = "gem", path = "{root}")

load("@gem//tools:deps.bzl", "gem_dependencies")

gem_dependencies()
"""

_USER_BUILD = """\
py_test(
    name = "uses_gem",
    srcs = ["uses_gem.py"],
    deps = ["@gem//kernels", "@gem//precision"],
    python_version = "PY3",
)

py_binary(
    name = "uses_gem_bin",
    srcs = ["uses_gem.py"],
    main = "uses_gem.py",
    deps = ["@gem//kernels", "@gem//precision"],
    python_version = "PY3",
)
"""

# Real work, checked against plain torch: jagged causal attention (reference backend on CPU)
# against SDPA per sequence, and an MX round trip within the E4M3 step.
_USER_TEST = """\
import sys
import torch
import gem_kernels
import gem_precision

torch.manual_seed(0)
lengths = [5, 0, 9]
offsets = torch.tensor([0, 5, 5, 14])
q, k, v = (torch.randn(14, 2, 16) for _ in range(3))
out = gem_kernels.jagged_flash_attention(q, k, v, offsets, offsets, 9, 9, causal=True)
for b, n in enumerate(lengths):
    s = int(offsets[b])
    want = torch.nn.functional.scaled_dot_product_attention(
        *(t[s:s + n].transpose(0, 1) for t in (q, k, v)), is_causal=True).transpose(0, 1)
    torch.testing.assert_close(out[s:s + n], want, rtol=1e-5, atol=1e-5)
print("gem_kernels", gem_kernels.__version__, "from", gem_kernels.__file__)
print("gem_precision", gem_precision.__version__, "python", sys.executable)
"""


def _rmtree(path: Path) -> None:
    def onerror(func: Any, p: str, _: Any) -> None:  # Bazel leaves read-only dirs behind
        os.chmod(os.path.dirname(p), stat.S_IRWXU)
        os.chmod(p, stat.S_IRWXU)
        func(p)
    shutil.rmtree(path, onerror=onerror)


def test_bazel_workspace_uses_gem(tmp_path: Path) -> None:
    bazel = shutil.which("bazel")
    assert bazel, "bazel not on PATH (run ./bazelw once to install it)"
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "WORKSPACE").write_text(_USER_WORKSPACE.format(root=ROOT))
    (ws / "BUILD").write_text(_USER_BUILD)
    (ws / "uses_gem.py").write_text(_USER_TEST)
    ob = tmp_path / "output_base"
    startup = [bazel, f"--output_base={ob}", "--max_idle_secs=30"]
    flags = ["--nosandbox_debug", "--color=no", "--curses=no"]
    try:
        out = _run([*startup, "test", "//:uses_gem", "--test_output=all", *flags], cwd=ws)
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
        assert "gem_kernels" in out.stdout and f"{ROOT}/.venv" in out.stdout, out.stdout[-4000:]
        # `bazel run` uses the toolchain's stub_shebang, not the test environment: check it too.
        ran = _run([*startup, "run", "//:uses_gem_bin", *flags], cwd=ws)
        assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-4000:]
        assert f"python {ROOT}/.venv/bin/python3" in ran.stdout, ran.stdout
    finally:
        _run([*startup, "shutdown"], cwd=ws, timeout=60)
        _rmtree(ob)
