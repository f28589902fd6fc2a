"""Where a sampled run's wall time went: py-spy's collapsed stacks, summed per frame.

    py-spy record -r 200 -f raw -o STACKS.txt -- python3 -m gem_trainer ...
    python3 tools/stacks.py STACKS.txt [--rate 200] [--under train] [--top 30]

py-spy samples the real stacks (every thread; run it as a user who may ptrace), so, unlike
cProfile, dynamo's frame hook does not hide callers. Two cautions:
- py-spy stops the process for each sample. On the 16-core GPU box at 200 samples/s the h200
  preset's warm time to first step went from ~8.6 s to 12.3-17.7 s (thirty-first session):
  read the shares, not the seconds;
- without `--idle` it drops samples where a thread waits (a subprocess, a lock, the GPU):
  such waits are missing from the sums. Add `--idle` to see them.
Prints, for the samples whose stack holds a frame named `--under`
(default `train`, gem_trainer's loop; "" = all):
- the seconds under it, and the share spent importing modules (`_find_and_load` on the stack);
- the frames with the most inclusive time (each counted once per sample), then with the most
  self time (the sample's last frame), file and function without line numbers.
A frame is py-spy's "function (file:line)"; seconds = samples / rate.
"""
from __future__ import annotations

import argparse
import collections
import re

_LINE = re.compile(r":\d+\)$")


def frame_key(frame: str) -> str:
    """`fn (path/file.py:123)` -> `fn (path/file.py)`: one entry per function."""
    return _LINE.sub(")", frame)


def summarize(lines: list[str], under: str = "train") -> tuple[int, int, int, collections.Counter[str], collections.Counter[str]]:
    """(all samples, samples under `under`, of those importing, inclusive, self) from
    collapsed-stack lines `frame;frame;... COUNT`."""
    total = kept = importing = 0
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for n, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        if not stack and count.isdigit():  # a sample with no Python frame (idle, native)
            total += int(count)
            continue
        if not count.isdigit():
            raise ValueError(f"line {n}: {line[:80]!r} is not 'frame;frame;... COUNT' (py-spy record -f raw)")
        k = int(count)
        total += k
        frames = [frame_key(f) for f in stack.split(";")]
        if under and not any(f.split(" (", 1)[0] == under for f in frames):
            continue
        kept += k
        if any(f.startswith("_find_and_load ") for f in frames):
            importing += k
        for f in set(frames):
            inclusive[f] += k
        own[frames[-1]] += k
    return total, kept, importing, inclusive, own


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stacks")
    p.add_argument("--rate", type=float, default=200.0, help="py-spy's --rate (samples per second)")
    p.add_argument("--under", default="train", help="keep samples with a frame of this function name")
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args(argv)
    if a.rate <= 0:
        p.error(f"--rate={a.rate} must be > 0")
    with open(a.stacks, encoding="utf-8", errors="replace") as f:
        try:
            total, kept, importing, inclusive, own = summarize(f.readlines(), a.under)
        except ValueError as e:
            p.error(f"{a.stacks}: {e}")
    s = 1.0 / a.rate
    where = f"under {a.under!r}" if a.under else "in all"
    print(f"{total * s:.2f} s sampled; {kept * s:.2f} s {where}, of which {importing * s:.2f} s importing modules")
    print(f"--- inclusive (top {a.top})")
    for name, k in inclusive.most_common(a.top):
        print(f"{k * s:8.2f}  {name[:160]}")
    print(f"--- self (top {a.top})")
    for name, k in own.most_common(a.top):
        print(f"{k * s:8.2f}  {name[:160]}")


if __name__ == "__main__":
    main()
