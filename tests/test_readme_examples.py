"""Every module README's Python examples run as written (a user copies them first).

Each ```python block of `<module>/README.md` is written to a file and run in a fresh
directory: with `python`, or, when its first line reads `# torchrun --nproc-per-node N`,
through `torch.distributed.run` with N processes. The examples carry their own asserts
(shapes, the names a conversion returns, a bitwise resume, ...), so a README whose API or
claims drifted from the code fails here. On a CPU machine they take their CPU paths (gloo,
the kernels' references, the FP8 emulation); where GPUs are visible (one per rank for the
distributed ones), their CUDA paths. CI runs the CPU paths; the CUDA paths have not yet run
on a GPU machine (which has no torchrec, so the parallel example cannot run there as is).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

MODULES = ["data", "kernels", "precision", "comms", "parallel", "model", "checkpoint", "transfer", "trainer"]
_TORCHRUN = re.compile(r"# torchrun --nproc-per-node (\d+)$")


def _root() -> Path:
    """The workspace: Bazel's runfiles tree (the READMEs are the test's data), else the checkout."""
    if "TEST_SRCDIR" in os.environ:
        return Path(os.environ["TEST_SRCDIR"]) / os.environ.get("TEST_WORKSPACE", "gem")
    return Path(__file__).resolve().parents[1]


def _examples() -> list[tuple[str, int, str]]:
    found = []
    for m in MODULES:
        text = (_root() / m / "README.md").read_text()
        found += [(m, i, code) for i, code in enumerate(re.findall(r"```python\n(.*?)```", text, re.S))]
    return found


EXAMPLES = _examples()


def test_every_module_readme_has_an_example() -> None:
    assert sorted({m for m, _, _ in EXAMPLES}) == sorted(MODULES), [m for m, _, _ in EXAMPLES]


@pytest.mark.parametrize("module, index, code", EXAMPLES, ids=[f"{m}-{i}" for m, i, _ in EXAMPLES])
def test_the_example_runs(module: str, index: int, code: str, tmp_path: Path) -> None:
    script = tmp_path / f"{module}_{index}.py"
    script.write_text(code)
    launch = _TORCHRUN.match(code.splitlines()[0])
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={launch.group(1)}"] if launch else []
    cmd = [sys.executable, *torchrun, str(script)]
    # (TRITON_INTERPRET as the caller set it: Bazel sets it for every test, and forcing it
    # here would run a GPU machine's kernels in the interpreter)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{module}/README.md example {index} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
