"""`python3 -m gem_trainer` / `bazel run //trainer:gem`: train a GEM-like model.

With no arguments: the tiny preset on the embedded synthetic task, on CPU, ~1 minute.
Prints per-task NE/AUC next to the planted task's Bayes-optimal values, then one JSON line.
Several processes: `torchrun --nproc-per-node N -m gem_trainer ...` (gloo on CPU, NCCL on GPU).

Every flag sets the TrainConfig field of the same name (`--ckpt-dir` → `ckpt_dir`); its help
line is the first sentence of the field's docstring and its default comes from the presets,
so neither can drift from the config. Errors name the flag, not the field (`cli_message`).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import sys
from typing import Any

from gem_trainer import config as _config
from gem_trainer.config import PRESETS, TrainConfig

# Fields whose values come from a fixed set (argparse checks them and lists them in --help).
_CHOICES: dict[str, tuple[str, ...]] = {
    "precision": tuple(getattr(_config, "PRECISIONS", ())),
    "sparse_sharding": tuple(getattr(_config, "SPARSE_SHARDINGS", ())),
    "comms": tuple(getattr(_config, "COMMS", ())),
    "ckpt_writer": tuple(getattr(_config, "CKPT_WRITERS", ())),
    "table_grads": tuple(getattr(_config, "TABLE_GRADS", ())),
}
# Extra words for a few flags (the docstring says what the field is; this says how to use it).
_EXTRA = {
    "ckpt_dir": "A new run refuses a directory that already holds checkpoints (use --resume)",
    "resume": "With no checkpoint yet: a notice, and the run starts at step 0",
    "progress": "On a pipe or file (no terminal): a line every --log-every steps on stderr "
                "instead; --no-progress turns off both",
    "export_teacher": "Score with it: python3 -m gem_transfer --teacher PATH",
    "sparse_mp": "Below the world size: 2-D sparse parallelism (DMPCollection)",
    "compile_aot": "'auto': $GEM_CACHE_DIR/aot (else ~/.cache/gem/aot) where a run can use it "
                   "(one process, compiled, unsharded tables), else off",
    "ckpt_writer": "On the H200 the process writer kept --ckpt-every 50 with a 3.3 GB state; the "
                   "thread writer saved every 100 steps (trainer/BENCHMARKS.md)",
}


def _field_docs() -> dict[str, str]:
    """field -> first sentence of its entry under `Attributes:` in TrainConfig's docstring."""
    doc = TrainConfig.__doc__ or ""
    out: dict[str, str] = {}
    body = doc.split("Attributes:", 1)[-1]
    for m in re.finditer(r"^\s{8}(\w+): (.*(?:\n\s{12}.*)*)", body, flags=re.M):
        text = " ".join(m.group(2).split())
        out[m.group(1)] = re.split(r"(?<=\.)\s", text, maxsplit=1)[0].rstrip(".")
    return out


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if v == "":
        return "off"
    return str(v)


def _default_text(field: str) -> str:
    """'(default: 150)' or, where the presets differ, "(default: preset's; tiny 150, h200 200)"."""
    vals = {name: getattr(make(), field) for name, make in PRESETS.items()}
    if len(set(map(repr, vals.values()))) == 1:
        return f"(default: {_show(next(iter(vals.values())))})"
    return "(default: preset's; " + ", ".join(f"{n} {_show(v)}" for n, v in vals.items()) + ")"


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, str]]:
    """The CLI parser and the field -> flag map (the one place that says which flag sets
    which field; `cli_message` uses it to name flags in errors)."""
    p = argparse.ArgumentParser(prog="gem", description=(__doc__ or "").splitlines()[0])
    docs = _field_docs()
    flags: dict[str, str] = {}
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS),
                   help="model/data preset; the other defaults follow it (default: tiny)")
    flags["preset"] = "--preset"
    fields = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "preset"]
    flags.update({name: "--" + name.replace("_", "-") for name in fields})
    base = TrainConfig()
    for name in fields:
        words = [docs.get(name, name.replace("_", " "))] + ([_EXTRA[name]] if name in _EXTRA else [])
        text = cli_message(". ".join(words), flags) + " " + _default_text(name)
        kind = type(getattr(base, name))
        kw: dict[str, Any] = {"dest": name, "default": None, "help": text.replace("%", "%%")}
        if kind is bool:
            p.add_argument(flags[name], action=argparse.BooleanOptionalAction, **kw)
            continue
        if _CHOICES.get(name):
            kw["choices"] = _CHOICES[name]
        p.add_argument(flags[name], type=kind, **kw)
    p.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=None,
                   help="torch's deterministic algorithms, so the same command gives the same "
                        "losses bit for bit; a little slower on GPU (and the Triton GDPA backward "
                        "still accumulates with atomics there) (default: on for CPU, off for GPU)")
    return p, flags


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    return _parse(argv)[0]


def _parse(argv: list[str] | None) -> tuple[TrainConfig, bool | None]:
    p, _ = build_parser()
    a = vars(p.parse_args(argv))
    preset = a.pop("preset")
    deterministic = a.pop("deterministic")
    overrides = {k: v for k, v in a.items() if v is not None}
    return PRESETS[preset](**overrides), deterministic


def cli_message(msg: str, flags: dict[str, str] | None = None) -> str:
    """Rewrites a config error for the command line: `ckpt_dir='/x'` -> `--ckpt-dir=/x`,
    `resume=True` -> `--resume`, `` `steps` `` and bare snake_case field names -> `--steps`."""
    if flags is None:
        flags = build_parser()[1]
    bools = {f.name for f in dataclasses.fields(TrainConfig) if isinstance(getattr(TrainConfig(), f.name), bool)}
    names = "|".join(sorted(map(re.escape, flags), key=len, reverse=True))
    value = r"'[^']*'|\"[^\"]*\"|[^\s,;:()]+"

    def assign(m: re.Match[str]) -> str:
        name, raw = m.group(1), m.group(2)
        flag = flags[name]
        if name in bools and raw in ("True", "False"):
            return flag if raw == "True" else "--no-" + flag[2:]
        if raw[:1] in "'\"" and raw[-1:] == raw[:1]:
            raw = shlex.quote(raw[1:-1])
        return f"{flag}={raw}"

    msg = re.sub(rf"(?<![\w-])({names})=({value})", assign, msg)
    msg = re.sub(rf"`({names})`", lambda m: flags[m.group(1)], msg)
    snake = "|".join(re.escape(n) for n in flags if "_" in n)
    if snake:
        msg = re.sub(rf"(?<![\w-])({snake})(?![\w=-])", lambda m: flags[m.group(1)], msg)
    return msg


def _num(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, (int, float)) else "n/a"


def main(argv: list[str] | None = None) -> int:
    from gem_trainer._metrics import dumps

    try:
        cfg, deterministic = _parse(argv)
        cfg.validate()
    except ValueError as e:
        print(f"gem: error: {cli_message(str(e))}", file=sys.stderr)
        return 2
    from gem_trainer import _preflight
    from gem_trainer._loop import train

    # FlashAttention-4 (gem_kernels' attention where flash-attn-4 is installed) JIT-compiles its
    # kernels at first use; its on-disk cache spares a later run that time. Read when the
    # package is imported (at the first attention call); an explicit setting wins.
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    render, _preflight.render = _preflight.render, cli_message  # notices name flags, like the errors
    try:
        summary = train(cfg, deterministic=deterministic)
    except ValueError as e:
        print(f"gem: error: {cli_message(str(e))}", file=sys.stderr)
        return 2
    finally:  # (main called in a process that goes on, e.g. a test: its later notices name fields)
        _preflight.render = render
    _release_process_group()
    if summary.get("world_size", 1) == 1 or _rank() == 0:
        for task, m in summary["tasks"].items():
            print(f"{task:>12}: NE {_num(m['ne'])} (Bayes {_num(m['ne_bayes'])})  "
                  f"AUC {_num(m['auc'])} (Bayes {_num(m['auc_bayes'])})")
        print(dumps(summary))
    return 1 if summary.get("stop_reason") == "nan" else 0


def _release_process_group() -> None:
    """Destroys the process group a finished run initialised (torchrun ranks; one process with
    torchrec tables runs in a world of one). Left alive, Gloo's worker threads can meet the
    interpreter's shutdown and abort the process ("terminate called without an active
    exception", SIGABRT after a good run). Only after a run that returned: a rank that failed
    may leave others inside a collective, and a destroy there could wait for them."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _rank() -> int:
    import os

    return int(os.environ.get("RANK", "0"))


if __name__ == "__main__":
    sys.exit(main())
