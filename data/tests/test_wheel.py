"""`pip wheel ./data` builds a wheel that installs and imports in a clean venv, away from the repo."""
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import gem_data


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


def test_wheel_builds_and_imports_in_clean_venv(tmp_path: Path) -> None:
    root = Path(gem_data.__file__).resolve().parent.parent  # the module folder (data/)
    if not (root / "pyproject.toml").exists():  # under Bazel the package dir is a runfiles symlink
        root = Path(gem_data.__file__).parent.parent
    src = tmp_path / "src"
    shutil.copytree(root, src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "tests", "build", "*.egg-info"))
    version = tomllib.loads((src / "pyproject.toml").read_text())["project"]["version"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", str(wheels), str(src)], tmp_path, env)
    (whl,) = wheels.glob("gem_data-*.whl")
    assert whl.name.startswith(f"gem_data-{version}-")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    py = venv / "bin" / "python"
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, env).strip())
    # torch / numpy / pyarrow come from this interpreter's site-packages; the repo does not
    (purelib / "_host_site.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(whl)],
         tmp_path, env)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    code = ("import gem_data, torch; from gem_data import presets, SyntheticSource; "
            "b = SyntheticSource(presets.tiny(), block_size=4).batch(0, 'native'); "
            "print(gem_data.__version__, gem_data.__file__, b.num_samples)")
    out = _run([str(py), "-I", "-c", code], outside, env).split()
    assert out[0] == version == gem_data.__version__
    assert Path(out[1]).resolve().is_relative_to(venv.resolve()), out[1]  # the installed copy, not the repo
    assert out[2] == "4"
