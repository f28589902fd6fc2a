"""One torch thread per test process: Bazel runs test targets side by side on this 2-core box,
and oversubscribed OpenMP threads spin (a teacher step ran >10x slower with two threads)."""
import torch

torch.set_num_threads(1)
