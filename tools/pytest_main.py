"""Runs pytest on the test files given as arguments, inside a Bazel py_test.

Each test starts from a seed of its own, drawn at random (the tests assert on fresh random
data) or taken from `GEM_TEST_SEED`; a failing test's report names it, so
`./bazelw test //trainer:test_table_grads --test_env=GEM_TEST_SEED=<seed>` replays its data.
"""
import atexit
import os
import random
import sys
import threading
from collections.abc import Generator
from typing import Any

import pytest

SEED_ENV = "GEM_TEST_SEED"


class Seeds:
    """Seeds Python's `random` and, where the test's module imported it, torch's generators
    before each test; adds the seed to a failing test's report."""

    def __init__(self, fixed: str | None) -> None:
        if fixed is not None and not fixed.isdigit():
            raise ValueError(f"{SEED_ENV}={fixed!r} must be a non-negative integer")
        self.fixed = None if fixed is None else int(fixed)
        self.seeds: dict[str, int] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        seed = self.fixed if self.fixed is not None else int.from_bytes(os.urandom(4), "little")
        self.seeds[item.nodeid] = seed
        random.seed(seed)
        torch = sys.modules.get("torch")  # not imported here: a test without torch stays without
        if torch is not None:
            torch.manual_seed(seed)  # the CPU generator and every CUDA device's

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Generator[None, Any, None]:
        outcome = yield
        report = outcome.get_result()
        seed = self.seeds.get(item.nodeid)
        if report.failed and seed is not None:
            report.sections.append(("test seed", f"{SEED_ENV}={seed} replays this test's random data"))

if __name__ == "__main__":
    tmp = os.environ.get("TEST_TMPDIR")
    if tmp:
        os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tmp, "hypothesis"))
    args = ["-q", "-p", "no:cacheprovider", "-o", "python_files=test_*.py", *sys.argv[1:]]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args.append(f"--junitxml={xml}")
    rc = int(pytest.main(args, plugins=[Seeds(os.environ.get(SEED_ENV))]))
    # Everything a normal exit does that a test could depend on, in the interpreter's order:
    # wait for non-daemon threads, run the atexit handlers (multiprocessing's clean-up,
    # weakref.finalize, tempfile), flush stdio. Then skip the interpreter's own teardown
    # (module clearing and the final collection of torch's object graph): ~1 s per test
    # process on the 2-core CI box, after the results (and the JUnit XML) are written.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
