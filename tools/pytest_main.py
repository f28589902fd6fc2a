"""Runs pytest on the test files given as arguments, inside a Bazel py_test."""
import os
import sys

import pytest

if __name__ == "__main__":
    tmp = os.environ.get("TEST_TMPDIR")
    if tmp:
        os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tmp, "hypothesis"))
    args = ["-q", "-p", "no:cacheprovider", "-o", "python_files=test_*.py", *sys.argv[1:]]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args.append(f"--junitxml={xml}")
    sys.exit(pytest.main(args))
