"""Benchmarks of gem_transfer (run as `python3 -m gem_transfer.bench.<name>`)."""
