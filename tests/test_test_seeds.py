"""The Bazel test runner (tools/pytest_main.py) seeds each test and names the seed of a failing
one; `GEM_TEST_SEED` replays that test's random data."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

MAIN = Path(__file__).resolve().parents[1] / "tools" / "pytest_main.py"

PROBE = '''
import random
import torch

def test_draws():
    print("DRAWS", int(torch.randint(0, 10**9, ())), random.randrange(10**9), float(torch.rand(())))
    assert False
'''


def _run(tmp_path: Path, seed: str | None) -> str:
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("XML_OUTPUT_FILE", "GEM_TEST_SEED")}
    if seed is not None:
        env["GEM_TEST_SEED"] = seed
    out = subprocess.run([sys.executable, str(MAIN), "-s", str(tmp_path / "test_probe.py")], env=env,
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode != 0, out.stdout  # the probe fails on purpose
    return out.stdout + out.stderr


def _draws(log: str) -> str:
    m = re.search(r"^DRAWS .*$", log, re.M)
    assert m, log
    return m.group(0)


def test_a_failing_test_names_its_seed_and_the_seed_replays_it(tmp_path: Path) -> None:
    first = _run(tmp_path, None)
    m = re.search(r"GEM_TEST_SEED=(\d+) replays this test's random data", first)
    assert m, first
    again = _run(tmp_path, m.group(1))
    assert _draws(again) == _draws(first)
    assert f"GEM_TEST_SEED={m.group(1)} replays" in again
    other = str((int(m.group(1)) + 1) % 2**32)
    assert _draws(_run(tmp_path, other)) != _draws(first)


@pytest.mark.parametrize("bad", ["x", "-3", "1.5"])
def test_a_bad_seed_names_the_variable_and_the_rule(tmp_path: Path, bad: str) -> None:
    log = _run(tmp_path, bad)
    assert f"GEM_TEST_SEED='{bad}' must be a non-negative integer" in log, log
