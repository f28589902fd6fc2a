"""How much a busy training thread stretches an async checkpoint write (CPU, no GPU needed).

(Since gem-checkpoint 0.1.3 the write itself runs at a 0.5 ms switch interval whatever
`--switch-ms` sets; `--switch-ms` still sets it for the staging and between writes.)

    python3 tools/bench_ckpt_gil.py [--tensors 400] [--switch-ms 5] [--writer thread|process] [--neighbour thread-py ...]

Saves a state of N fp32 [256, 1024] tensors with gem_checkpoint's async Checkpointer while a
neighbour runs: none (idle), a pure-Python thread (holds the GIL between the interpreter's
forced switches), a thread of small torch ops (torch drops the GIL inside each op), or a
pure-Python *process* (competes for cores, not for the GIL). The writer serialises each tensor
with torch.save (DCP's format), which takes the GIL many times per tensor: beside a GIL-hungry
thread each take waits up to the switch interval (`sys.setswitchinterval`, 5 ms by default).
Prints one line per neighbour: staging (save() call) and write seconds.
"""
import argparse
import multiprocessing as mp
import shutil
import sys
import tempfile
import threading
import time

import torch

from gem_checkpoint import Checkpointer


def _spin_py(stop: "threading.Event | mp.synchronize.Event") -> None:
    while not stop.is_set():
        sum(range(2000))


def _spin_torch(stop: threading.Event) -> None:
    x = torch.randn(64, 64)
    while not stop.is_set():
        for _ in range(50):
            x = x * 1.0001 + 0.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tensors", type=int, default=400)
    p.add_argument("--switch-ms", type=float, default=5.0, help="sys.setswitchinterval, ms")
    p.add_argument("--writer", choices=["thread", "process"], default="thread",
                   help="gem_checkpoint's writer (process: a child with its own GIL)")
    p.add_argument("--neighbour", nargs="+", default=["idle", "thread-py", "thread-torch", "process-py"],
                   choices=["idle", "thread-py", "thread-torch", "process-py"])
    a = p.parse_args()
    sys.setswitchinterval(a.switch_ms / 1e3)
    state = {"model": {f"w{i}": torch.randn(256, 1024) for i in range(a.tensors)}}
    print(f"{a.tensors} tensors, {a.tensors * 256 * 1024 * 4 / 1e9:.2f} GB, switch interval {a.switch_ms} ms")
    for kind in a.neighbour:
        root = tempfile.mkdtemp(prefix="gem_ckpt_gil_")
        try:
            ck = Checkpointer(root, writer=a.writer)
            ck.prepare(state)
            ck.save(0, state)  # untimed: a process writer's first write also waits for its start-up
            ck.wait()
            stop: "threading.Event | mp.synchronize.Event"
            if kind == "process-py":
                stop = mp.Event()
                worker: "threading.Thread | mp.Process | None" = mp.Process(target=_spin_py, args=(stop,))
            else:
                stop = threading.Event()
                worker = (None if kind == "idle" else
                          threading.Thread(target=_spin_py if kind == "thread-py" else _spin_torch, args=(stop,)))
            if worker is not None:
                worker.start()
            t0 = time.perf_counter()
            ck.save(1, state)
            t1 = time.perf_counter()
            ck.wait()
            stop.set()
            if worker is not None:
                worker.join()
            ck.close()
            print(f"{a.writer:7s} {kind:13s} stage {t1 - t0:6.2f} s   write {ck.last_write_s:6.2f} s")
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
