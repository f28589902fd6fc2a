"""Run a gem_trainer entry point with GEMConfig fields overridden: the A/B of a model switch
that has no trainer flag (the trainer builds its model from the preset).

    python3 tools/with_model.py merged_stream_reads=true -- -m gem_trainer --preset h200 --steps 60
    python3 tools/with_model.py merged_stream_reads=true -- -m gem_trainer.bench.quality --preset h200
    python3 tools/with_model.py merged_stream_reads=true -- tools/profile_trainer.py --preset h200

Values: true / false, ints, floats, or strings. The overrides replace the fields of the
config that `gem_trainer._loop.model_config` returns (training and the quality bench both
build their model through it); an unknown field is an error before anything runs.
"""
from __future__ import annotations

import dataclasses
import runpy
import sys
from typing import Any


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def main(argv: list[str]) -> None:
    if "--" not in argv or len(argv) < argv.index("--") + 2 or argv[-1] == "-m":
        raise SystemExit("usage: with_model.py FIELD=VALUE ... -- (-m MODULE | SCRIPT.py) [ARGS ...]")
    cut = argv.index("--")
    pairs = [a.split("=", 1) for a in argv[:cut]]
    if any(len(p) != 2 for p in pairs):
        raise SystemExit(f"overrides {argv[:cut]} must each be FIELD=VALUE")
    over = {k: _value(v) for k, v in pairs}

    import gem_model
    from gem_trainer import _loop

    known = {f.name for f in dataclasses.fields(gem_model.GEMConfig)}
    unknown = sorted(set(over) - known)
    if unknown:
        raise SystemExit(f"{unknown} are not GEMConfig fields")
    base = _loop.model_config

    def model_config(*args: Any, **kwargs: Any) -> gem_model.GEMConfig:
        return dataclasses.replace(base(*args, **kwargs), **over)

    _loop.model_config = model_config  # type: ignore[assignment]
    print(f"with_model: GEMConfig overrides {over}", file=sys.stderr)
    if argv[cut + 1] == "-m":
        module, rest = argv[cut + 2], argv[cut + 3:]
        sys.argv = [module, *rest]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, rest = argv[cut + 1], argv[cut + 2:]
        sys.argv = [script, *rest]
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
