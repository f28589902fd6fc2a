"""Shared bench helpers for the jagged attention ops: batches, FLOP counts, timing, output.

Used by `bench/attention.py` (JFA) and `bench/gdpa.py`. Timing follows DESIGN.md §5: warm
up, CUDA events, median. Useful FLOPs count only unpadded, visible work: 4·Σ visible (q, k)
pairs·D·H forward and 2.5× that backward (issue 3).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from gem_kernels._jagged import visible_mask


def lognormal_lengths(
    n: int, *, mean: float, cap: int, sigma: float = 0.85, seed: int = 0, min_len: int = 1
) -> list[int]:
    """`n` log-normal lengths with the given mean (before capping at `cap`), fixed seed."""
    g = torch.Generator().manual_seed(seed)
    mu = math.log(mean) - sigma**2 / 2
    x = torch.randn(n, generator=g, dtype=torch.float64) * sigma + mu
    return [int(min(cap, max(min_len, round(math.exp(float(v)))))) for v in x]


def issue_lengths(n: int = 64, *, mu: float = 6.5, seed: int = 62) -> list[int]:
    """The issue's batch: `torch.manual_seed(seed)`; LogNormal(mu, 1.0) clamped to 64..16384."""
    torch.manual_seed(seed)
    x = torch.distributions.LogNormal(mu, 1.0).sample((n,))  # type: ignore[no-untyped-call]
    return [int(v) for v in x.clamp(64, 16384).long().tolist()]


def trainer_lengths(tokens: int = 262144, seed: int = 0) -> list[int]:
    """The h200 trainer's batches: lengths as gem_data's GEM preset draws them (log-normal,
    mean 1,000, sigma 1.0, clamped to 16..16384), sequences added until `tokens` is reached
    (the trainer's `batch_tokens`; ~260 sequences)."""
    g = torch.Generator().manual_seed(seed)
    mu, sigma = math.log(1000.0) - 0.5, 1.0
    out: list[int] = []
    while sum(out) < tokens:
        n = float(torch.exp(mu + sigma * torch.randn((), generator=g)))
        out.append(min(16384, max(16, round(n))))
    return out


def uniform_lengths(n: int, lo: int, hi: int, *, seed: int = 0) -> list[int]:
    """`n` lengths uniform in [lo, hi], fixed seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (n,), generator=g).tolist()


def offsets_from_lengths(lengths: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """int64 `[B+1]` offsets."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    if lengths:
        out[1:] = torch.tensor(list(lengths), dtype=torch.int64).cumsum(0)
    return out.to(device)


def random_jagged(
    lengths: Sequence[int],
    heads: int,
    dim: int,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int = 0,
) -> torch.Tensor:
    """Random `[sum(lengths), H, D]` values (standard normal)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(sum(lengths), heads, dim, generator=g, device=device).to(dtype)


def visible_pairs(
    len_q: Sequence[int], len_kv: Sequence[int], *, causal: bool = False, window: int | None = None
) -> int:
    """Σ over samples of visible (query, key) pairs under the shared visibility rule."""
    total = 0
    for lq, lk in zip(len_q, len_kv):
        if lq == 0 or lk == 0:
            continue
        if not causal and window is None:
            total += lq * lk
            continue
        # Closed form per row: keys [lo, hi) with the same rule as _jagged.visible_mask.
        ipos = torch.arange(lq, dtype=torch.int64) + (lk - lq)
        lo = torch.zeros_like(ipos)
        hi = torch.full_like(ipos, lk)
        if causal:
            hi = torch.minimum(hi, ipos + 1)
        if window is not None:
            lo = torch.maximum(lo, ipos - window + 1)
            if not causal:
                hi = torch.minimum(hi, ipos + window)
        total += int((hi - lo).clamp(min=0).sum())
    return total


def check_visible_pairs_small() -> None:
    """Self-check of `visible_pairs` against the mask rule (cheap; run by the benches)."""
    for causal, window in ((True, None), (True, 5), (False, 3)):
        want = sum(
            int(visible_mask(a, b, causal=causal, window=window).sum())
            for a, b in ((7, 9), (9, 7), (1, 4), (0, 3))
        )
        got = visible_pairs([7, 9, 1, 0], [9, 7, 4, 3], causal=causal, window=window)
        assert got == want, (causal, window, got, want)


def attention_flops(pairs: int, heads: int, dim: int) -> tuple[float, float]:
    """(forward, forward+backward) useful FLOPs: 4·pairs·D·H and 3.5× that."""
    fwd = 4.0 * pairs * dim * heads
    return fwd, fwd * 3.5


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max(1, max |want|) in fp32 (0 for empty tensors): the benches' error column."""
    if want.numel() == 0:
        return 0.0
    got, want = got.detach().float(), want.detach().float()
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def tflops(flops: float, ms: float | None) -> float | None:
    """TFLOP/s of `flops` done in `ms` milliseconds (None when the timing is missing)."""
    return None if ms is None else flops / (ms * 1e-3) / 1e12


def bench_ms(fn: Callable[[], object], *, warmup: int = 3, iters: int = 10) -> float:
    """Median wall time of `fn` in ms (CUDA events on the GPU, perf_counter on the CPU)."""
    for _ in range(warmup):
        fn()
    cuda = torch.cuda.is_available()
    times: list[float] = []
    if cuda:
        torch.cuda.synchronize()
        for _ in range(iters):
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def host_us(fn: Callable[[], object], calls: int, *, warmup: int = 3) -> float:
    """Host µs per call of `fn`: CPU clock over `calls` calls with no sync inside the loop (few
    enough that the launch queue does not fill and block the host), after `warmup` calls."""
    for _ in range(warmup):
        fn()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t
    if cuda:
        torch.cuda.synchronize()
    return dt / calls * 1e6


def capture_graph(fn: Callable[[], object]) -> tuple[Callable[[], None] | None, str | None]:
    """(`fn` captured in a CUDA graph -> its replay, None) or (None, why it was not captured).

    `fn` runs twice on a side stream first (warm-up, as torch's capture rules ask), then once
    under capture; each replay re-runs the captured kernels on the same memory. Used by the
    kernels' benches (`gem_model.bench.local_mfu` keeps its own copy: this folder is not part
    of the gem_kernels library that package depends on).
    """
    if not torch.cuda.is_available():
        return None, "no CUDA"
    try:
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - reported to the caller: its figure is left out, not faked
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return graph.replay, None


def bench_graph_ms(fn: Callable[[], object], *, iters: int = 10) -> float | None:
    """Median ms of `fn` replayed as a CUDA graph: device time without Python launch overhead.

    None on the CPU or when `fn` cannot be captured.
    """
    replay, _ = capture_graph(fn)
    return None if replay is None else bench_ms(replay, warmup=2, iters=iters)


def env_info() -> dict[str, str]:
    """GPU name (or 'cpu'), torch and triton versions, python."""
    info = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency
        info["triton"] = "missing"
    return info


def print_table(rows: Sequence[dict[str, object]], columns: Sequence[str]) -> None:
    """Plain fixed-width table."""
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))


def _fmt(x: object) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}" if abs(x) < 1e4 else f"{x:.0f}"
    return str(x)


def emit_json(payload: dict[str, object]) -> None:
    """The final one-line JSON."""
    print(json.dumps(payload, sort_keys=True, default=str))


def save_json(out_dir: str | None, name: str, payload: dict[str, object]) -> None:
    """Writes `payload` to `out_dir/name` (indented JSON; the folder made if missing); no-op
    without `out_dir` (the benches' `--out`)."""
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(payload, f, indent=1, default=str)
