"""gem_kernels.precompile: record a run's kernel specializations, compile them in worker
processes into Triton's disk cache.

On CPU: the manifest's checks, the recording hook (fed the calls Triton makes), the worker's
per-entry errors and the skip without a GPU. On the GPU: a recorded JFA forward compiles in
the workers into an empty Triton cache, and a fresh process then launches it without
compiling (it loads the workers' binary)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gem_kernels import precompile

GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


class _Fn:
    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


def _call_hook(module: str, name: str, spec: str) -> object:
    from triton import knobs

    hook = knobs.runtime.jit_cache_hook
    assert hook is not None
    return hook(key="k", repr="r", fn=_Fn(module, name), compile={"specialization_data": spec},
                is_manual_warmup=False, already_compiled=False)


def test_record_keeps_our_kernels_once_chains_and_restores(tmp_path: Path) -> None:
    from triton import knobs

    seen: list[str] = []

    def previous(*, fn: _Fn, **_: object) -> bool:
        seen.append(fn.name)
        return False

    knobs.runtime.jit_cache_hook = previous
    try:
        path = tmp_path / "sub" / "m.json"
        with precompile.record_compiles(path) as entries:
            assert _call_hook("gem_kernels._triton_jfa", "_jfa_fwd_kernel", '{"a": 1}') is False
            _call_hook("gem_kernels._triton_jfa", "_jfa_fwd_kernel", '{"a": 1}')  # the same one again
            _call_hook("gem_kernels._triton_jfa", "_jfa_fwd_kernel", '{"a": 2}')
            _call_hook("torch._inductor.x", "triton_poi", '{"a": 3}')  # not ours: not recorded
            assert len(entries) == 2
        assert knobs.runtime.jit_cache_hook is previous  # restored
        assert seen == ["_jfa_fwd_kernel"] * 3 + ["triton_poi"]  # every call reached the previous hook
    finally:
        knobs.runtime.jit_cache_hook = None
    doc = precompile.load_manifest(path)
    assert [k["spec"] for k in doc["kernels"]] == ['{"a": 1}', '{"a": 2}']
    assert doc["kernels"][0]["module"] == "gem_kernels._triton_jfa"
    assert doc["triton"] == precompile._triton_version()
    assert not (tmp_path / "sub" / "m.json.tmp").exists()


def test_record_writes_the_manifest_when_the_body_raises(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    with pytest.raises(RuntimeError, match="boom"):
        with precompile.record_compiles(path):
            _call_hook("gem_kernels._rope", "_rope_slots_kernel", '{"b": 1}')
            raise RuntimeError("boom")
    assert len(precompile.load_manifest(path)["kernels"]) == 1


@pytest.mark.parametrize("text, rule", [
    ("{not json", "not readable as JSON"),
    ('{"format": 9, "kernels": []}', "'format' must be 1"),
    ('{"format": 1, "kernels": [{"module": "m"}]}', "'kernels' must be a list"),
    ('{"format": 1, "kernels": {}}', "'kernels' must be a list"),
])
def test_bad_manifest_names_the_file_and_rule(tmp_path: Path, text: str, rule: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=rule) as e:
        precompile.start_precompile(path)
    assert str(path) in str(e.value)
    assert path.read_text() == text  # untouched
    with pytest.raises(ValueError, match="no such file|not readable"):
        precompile.load_manifest(tmp_path / "missing.json")


def test_workers_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="workers=0: must be >= 1"):
        precompile.start_precompile(tmp_path / "m.json", workers=0)


def _manifest(tmp_path: Path, kernels: list[dict[str, str]], **over: object) -> Path:
    doc = {"format": 1, "triton": precompile._triton_version(), "target": precompile._target(), "kernels": kernels}
    doc.update(over)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.skipif(GPU, reason="the skip without a GPU (the GPU test below starts workers)")
def test_skipped_without_a_gpu(tmp_path: Path) -> None:
    pre = precompile.start_precompile(_manifest(tmp_path, [{"module": "m", "name": "n", "spec": "{}"}]))
    assert pre.skipped is not None and "no CUDA GPU" in pre.skipped and pre.workers == []
    assert pre.wait()["preloaded"] == 0
    assert precompile.manifest_name() is None


def test_worker_counts_each_entry_and_drops_library_paths(tmp_path: Path) -> None:
    spec = json.dumps({"name": "x", "options": {"extern_libs": [["libdevice", "/elsewhere/libdevice.10.bc"]],
                                                "num_warps": 4}})
    assert json.loads(precompile._spec_for_here(spec))["options"] == {"num_warps": 4}
    path = _manifest(tmp_path, [
        {"module": "gem_kernels.no_such_module", "name": "k", "spec": spec},
        {"module": "gem_kernels._triton_jfa", "name": "no_such_kernel", "spec": spec},
    ])
    done = precompile._worker(str(path), 0, 1)
    assert done["preloaded"] == 0 and done["failed"] == 2
    assert "no_such_module" in done["errors"][0] and "no_such_kernel" in done["errors"][1]
    # The share of worker 1 of 2 is the second entry alone.
    assert precompile._worker(str(path), 1, 2)["failed"] == 1


def test_a_clean_finish_marks_the_cache_and_later_starts_skip(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    target = {"backend": "cuda", "arch": 90, "warp_size": 32}  # as if on a GPU
    monkeypatch.setattr(precompile, "_target", lambda: target)
    path = _manifest(tmp_path, [{"module": "m", "name": "n", "spec": "{}"}] * 2)
    marker = precompile.done_marker(path)
    assert marker.parent == cache / "gem_precompile" and not marker.exists()

    def fake_start(reply: str) -> precompile.Precompile:
        pre = precompile.Precompile(manifest=str(path), kernels=2, marker=marker)
        pre.workers.append(subprocess.Popen([sys.executable, "-c", f"print({reply!r})"],
                                            stdout=subprocess.PIPE, text=True))
        return pre

    # A worker that failed one kernel: no marker, so the next run preloads again.
    assert fake_start('{"preloaded": 1, "failed": 1}').wait()["failed"] == 1
    assert not marker.exists()
    done = fake_start('{"preloaded": 2, "failed": 0}').wait()
    assert done["preloaded"] == 2 and done["failed"] == 0 and marker.is_file()
    pre = precompile.start_precompile(path)
    assert pre.workers == [] and pre.skipped is not None and "earlier run" in pre.skipped
    # Another manifest (a byte changed) has its own marker: not skipped for that reason.
    path.write_text(path.read_text() + " ")
    assert precompile.done_marker(path) != marker


# One causal JFA forward through our pointer kernel (GEM_JFA_FWD=pointer: not FlashAttention's),
# as this process and the fresh one below both run it.
_JFA_ONCE = """
import torch, gem_kernels
lens = [700, 900, 333]
off = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda")
q, k, v = (torch.randn(sum(lens), 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
gem_kernels.jagged_flash_attention(q, k, v, off, off, max(lens), max(lens), causal=True, backend="triton")
torch.cuda.synchronize()
"""


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_gpu_workers_fill_an_empty_cache_that_a_fresh_process_loads(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from gem_kernels._triton_jfa import _jfa_fwd_kernel

    monkeypatch.setenv("GEM_JFA_FWD", "pointer")
    _jfa_fwd_kernel.device_caches.clear()  # so this process compiles (or loads) it again: recorded
    manifest = tmp_path / "m.json"
    with precompile.record_compiles(manifest) as entries:
        exec(_JFA_ONCE, {})
    names = {e["name"] for e in entries}
    assert "_jfa_fwd_kernel" in names
    target = precompile._target()
    assert target is not None
    assert precompile.manifest_name() == f"{target['backend']}{target['arch']}-triton{precompile._triton_version()}.json"
    cache = tmp_path / "triton_cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    pre = precompile.start_precompile(manifest, workers=2)
    assert pre.skipped is None and len(pre.workers) == min(2, len(entries))
    done = pre.wait(timeout=300)
    assert done["preloaded"] == len(entries) and done["failed"] == 0 and done["unfinished"] == 0, done
    assert any(cache.rglob("_jfa_fwd_kernel.cubin"))
    # A fresh process over that cache launches the same specialization and compiles nothing:
    # every kernel it needs comes from the workers' entries (its hook sees loads, which are
    # fast; a compile of this kernel takes over a second).
    code = ("import time, json\nfrom triton import knobs\nt = {}\n"
            "knobs.runtime.jit_cache_hook = lambda **kw: t.setdefault(kw['fn'].name, time.perf_counter()) and None\n"
            "knobs.runtime.jit_post_compile_hook = lambda **kw: t.__setitem__(kw['fn'].name, "
            "time.perf_counter() - t[kw['fn'].name])\n" + _JFA_ONCE + "print(json.dumps(t))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-2000:]
    took = json.loads(out.stdout.strip().splitlines()[-1])
    assert "_jfa_fwd_kernel" in took and took["_jfa_fwd_kernel"] < 0.5, took


def test_a_stopped_worker_leaves_no_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A run shorter than its workers ends them (`stop`): they count as unfinished, and no
    # marker is written, so the next run over that cache preloads again.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    path = _manifest(tmp_path, [{"module": "m", "name": "n", "spec": "{}"}])
    marker = precompile.done_marker(path)
    pre = precompile.Precompile(manifest=str(path), kernels=1, marker=marker)
    pre.workers.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                        stdout=subprocess.PIPE, text=True))
    done = pre.wait(timeout=0.2)
    assert done["unfinished"] == 1 and done["preloaded"] == 0
    pre.stop()
    assert pre.workers[0].poll() is not None  # ended, not left running
    assert not marker.exists()
