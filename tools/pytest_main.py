"""Runs pytest on the test files given as arguments, inside a Bazel py_test."""
import atexit
import os
import sys
import threading

import pytest

if __name__ == "__main__":
    tmp = os.environ.get("TEST_TMPDIR")
    if tmp:
        os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tmp, "hypothesis"))
    args = ["-q", "-p", "no:cacheprovider", "-o", "python_files=test_*.py", *sys.argv[1:]]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args.append(f"--junitxml={xml}")
    rc = int(pytest.main(args))
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
