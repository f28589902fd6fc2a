"""The whole transfer job: teacher (train or load) -> score -> students -> table.

Data split of one synthetic stream (the same planted function everywhere):
    teacher     blocks [0, T)              the full multi-domain stream
    students    blocks [T, T + S), S << T  far fewer samples, after the teacher's
                                           (a sweep: the first N of them, each N)
    held-out    blocks [2^30 / block, +H)  never trained on, >= eval_samples samples
With Parquet data the row groups play the blocks: held-out = the last row groups holding
>= eval_samples rows, students = the row groups just before them, teacher = the rest.

The students' samples are ones the teacher did not train on, as a value model trains on
fresh traffic the foundation model scores: on its own training samples the teacher's
outputs and tables carry memorized labels (Adagrad moves a rare id's row a full step per
occurrence), so a student fitting them there learns a leak that the held-out data lack
(measured in BENCHMARKS.md: sharing and combined lost 0.03-0.05 AUC on overlapping samples).
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gem_data
import gem_model
from gem_transfer._distill import METHODS, DistillConfig, ScoredSet, evaluate, method_config, predict, train_student
from gem_transfer._scoring import score_to_parquet
from gem_transfer._student import StudentConfig
from gem_transfer._teacher import load_teacher, save_teacher, teacher_tables, train_teacher
from gem_transfer._window import BlockWindow

PRESETS = ("tiny", "gem")
_HELD_OUT = 1 << 30  # first held-out sample index (synthetic)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransferConfig:
    """One transfer job.

    Attributes:
        preset: "tiny" (gem_data tiny + gem_model tiny, CPU) or "gem" (gem_data gem with
            histories capped at 8,192 + gem_model h200, one GPU).
        data: "synthetic" or "parquet:DIR" (a gem_data.write_parquet directory).
        teacher_samples: samples the teacher trains on (one pass).
        teacher_seconds: wall-time cap on teacher training (None: none); the result says
            how many samples it saw.
        teacher_batch_blocks: blocks per teacher step (when teacher_tokens is 0).
        teacher_tokens: token budget per teacher step (0: fixed teacher_batch_blocks).
        teacher_lr: AdamW peak learning rate of the teacher's dense parameters.
        teacher_table_lr: Adagrad learning rate of the teacher's embedding tables (None: AdamW).
        student_samples: labelled samples every student trains on (validation split included).
        eval_samples: held-out samples every model is scored on (at least this many).
        block_size: samples per synthetic block.
        blocks_per_shard: blocks per score shard.
        methods: which of METHODS to train ("label_only" and "kd" are needed for the gains).
        student_seeds: students per method (different init/split/shuffle); metrics are averaged.
        student_samples_sweep: also train every method on the first N of the student samples,
            for each N here (2 <= N <= student_samples): nested subsets of the one scored
            student set, the same held-out set and seeds, so the comparison across N is
            paired; the teacher trains and scores once. () : no sweep.
        sweep_seeds: students per method at the sweep's N other than student_samples (None:
            student_seeds); seeds 0..sweep_seeds-1, a prefix of the default N's seeds.
        student_domain: None: students learn (and are scored) on every domain; d: a value model
            of surface d — its student and held-out samples are domain d's only (the teacher
            still trains on every domain). Synthetic data only.
        seed: data seed (planted function) and teacher init.
        smoke: the preset's code path at toy sizes (short histories, small vocabularies, a
            narrow teacher of the same architecture): tests the gem preset on a CPU.
        time_budget: wall seconds for the whole `run_transfer` (None: no limit). The teacher
            stops at whichever comes first, teacher_seconds or the budget less a reserve for
            scoring and students (`_REST_SHARE` of it, `_REST_SHARE_SWEEP` with a sweep); the
            students share what remains in slices proportional to their samples (about the
            same epochs for every N), each stopping its epochs when its slice is spent.
        student: base student sizes; distill: student training.
    """

    preset: str = "tiny"
    data: str = "synthetic"
    teacher_samples: int = 65_536
    teacher_seconds: float | None = None
    teacher_batch_blocks: int = 1
    teacher_tokens: int = 0
    teacher_lr: float = 3e-3
    teacher_table_lr: float | None = 0.1
    student_samples: int = 2048
    eval_samples: int = 4096
    block_size: int = 64
    blocks_per_shard: int = 8
    methods: tuple[str, ...] = METHODS
    student_seeds: int = 1
    student_samples_sweep: tuple[int, ...] = ()
    sweep_seeds: int | None = None
    student_domain: int | None = None
    seed: int = 0
    smoke: bool = False
    time_budget: float | None = None
    student: StudentConfig = dataclasses.field(default_factory=StudentConfig)
    distill: DistillConfig = dataclasses.field(default_factory=DistillConfig)

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"TransferConfig.preset={self.preset!r} must be one of {PRESETS}")
        if self.data != "synthetic" and not (self.data.startswith("parquet:") and len(self.data) > 8):
            raise ValueError(f"TransferConfig.data={self.data!r} must be 'synthetic' or 'parquet:DIR'")
        for name in ("teacher_samples", "teacher_batch_blocks", "student_samples", "eval_samples",
                     "block_size", "blocks_per_shard", "student_seeds"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TransferConfig.{name}={v!r} must be an int >= 1")
        if isinstance(self.teacher_tokens, bool) or not isinstance(self.teacher_tokens, int) or self.teacher_tokens < 0:
            raise ValueError(f"TransferConfig.teacher_tokens={self.teacher_tokens!r} must be an int >= 0")
        for name in ("teacher_seconds", "time_budget"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"TransferConfig.{name}={v!r} must be > 0 or None")
        if self.student_domain is not None and (isinstance(self.student_domain, bool) or self.student_domain < 0):
            raise ValueError(f"TransferConfig.student_domain={self.student_domain!r} must be None or an int >= 0")
        bad = [m for m in self.methods if m not in METHODS]
        if bad or not self.methods:
            raise ValueError(f"TransferConfig.methods={self.methods!r} must be a non-empty subset of {METHODS}")
        for n in self.student_samples_sweep:
            if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= self.student_samples:
                raise ValueError(f"TransferConfig.student_samples_sweep={self.student_samples_sweep!r}: {n!r} must be "
                                 f"an int in [2, student_samples={self.student_samples}] (a subset of the "
                                 "students' samples, one kept for validation)")
        if self.sweep_seeds is not None and (isinstance(self.sweep_seeds, bool) or not isinstance(self.sweep_seeds, int)
                                             or self.sweep_seeds < 1):
            raise ValueError(f"TransferConfig.sweep_seeds={self.sweep_seeds!r} must be None or an int >= 1")
        if self.student_samples >= self.teacher_samples:
            raise ValueError(f"student_samples={self.student_samples} must be < teacher_samples="
                             f"{self.teacher_samples} (students learn from far fewer samples)")


# smoke: the gem preset's data and teacher at toy sizes (same features, tasks, domains, layer kinds)
_SMOKE_DATA: dict[str, Any] = dict(event_vocab=5000, seq_len_mean=48.0, seq_len_min=4, seq_len_cap=192,
                                   sparse_features=(("user_id", 2000), ("ad_id", 1000), ("advertiser", 200),
                                                    ("page", 100), ("country", 20)))
_SMOKE_MODEL: dict[str, Any] = dict(d_model=32, num_heads=2, num_layers=1, emb_dim=8, event_emb_dim=16, ffn_mult=2,
                                    num_cls=2, num_pma_seeds=2, num_recent=2, head_hidden=32, gdpa_kv_len=4,
                                    hier_seeds=4, hier_rank=2)
_REST_SHARE = 0.35  # of time_budget kept for scoring and the students when the teacher trains
# with a sweep: the students have more samples to fit (gem --sweep, 1 sweep seed: 1.44x the
# default's student work), so they get more of the budget and the teacher ~15 % less
_REST_SHARE_SWEEP = 0.45


def sweep_plan(cfg: TransferConfig) -> dict[int, int]:
    """{N: student seeds} in ascending N: student_samples with student_seeds, and each N of
    student_samples_sweep with sweep_seeds (or student_seeds)."""
    plan = {n: cfg.sweep_seeds or cfg.student_seeds for n in cfg.student_samples_sweep}
    plan[cfg.student_samples] = cfg.student_seeds
    return dict(sorted(plan.items()))


def data_config(cfg: TransferConfig) -> gem_data.DataConfig:
    if cfg.preset == "tiny":
        return gem_data.presets.tiny(seed=cfg.seed)
    return gem_data.presets.gem(**{"seed": cfg.seed, "seq_len_cap": 8192, **(_SMOKE_DATA if cfg.smoke else {})})


def teacher_config(cfg: TransferConfig, features: Any) -> gem_model.GEMConfig:
    make = gem_model.presets.tiny if cfg.preset == "tiny" else gem_model.presets.h200
    extra = _SMOKE_MODEL if cfg.smoke and cfg.preset == "gem" else {}
    return make(**gem_model.presets.feature_sizes(features), use_torchrec=False, **extra)


def _blocks_for(source: Any, start: int, samples: int, domain: int | None = None) -> list[int]:
    """Consecutive blocks from `start` holding >= samples rows (of `domain` only, if given)."""
    out, n, b = [], 0, start
    while n < samples:
        if source.num_blocks is not None and b >= source.num_blocks:
            raise ValueError(f"the data has too few rows: wanted {samples} from block {start}, got {n}")
        out.append(b)
        if domain is None:
            n += int(source.lengths(b).shape[0])
        else:  # reads the block (the domain column is not among the cheap lengths)
            h = source.read(b)
            n += 0 if h is None else int((np.asarray(h.domain) == domain).sum())
        b += 1
    return out


def _blocks_back(rows: list[int], end: int, want: int) -> tuple[int, int]:
    """Walks back from block `end` until the blocks [start, end) hold >= `want` rows (or
    block 0 is reached); returns (start, rows they hold)."""
    start, got = end, 0
    while got < want and start > 0:
        start -= 1
        got += rows[start]
    return start, got


def _splits(cfg: TransferConfig, dcfg: gem_data.DataConfig) -> tuple[Any, Any, list[int], list[int], Any]:
    """(source, teacher_source, student_blocks, eval_blocks, features)."""
    if cfg.data == "synthetic":
        src = gem_data.SyntheticSource(dcfg, block_size=cfg.block_size)
        t_blocks = math.ceil(cfg.teacher_samples / cfg.block_size)
        h0 = _HELD_OUT // cfg.block_size
        d = cfg.student_domain
        return (src, BlockWindow(src, 0, t_blocks), _blocks_for(src, t_blocks, cfg.student_samples, d),
                _blocks_for(src, h0, cfg.eval_samples, d), dcfg)
    # the preset's DataConfig gives the table sizes; ParquetSource checks the files against it
    psrc = gem_data.ParquetSource(cfg.data[len("parquet:"):], expect=dcfg)
    n = psrc.num_blocks
    rows = [int(psrc.lengths(u).shape[0]) for u in range(n)]
    k, got = _blocks_back(rows, n, cfg.eval_samples)
    if got < cfg.eval_samples or k == 0:
        raise ValueError(f"data={cfg.data!r}: {sum(rows)} rows cannot hold eval_samples={cfg.eval_samples} "
                         "held-out rows and a training part")
    if cfg.student_domain is not None:
        raise ValueError("student_domain is supported with synthetic data only")
    j, got = _blocks_back(rows, k, cfg.student_samples)
    if got < cfg.student_samples or j == 0:
        raise ValueError(f"data={cfg.data!r}: {sum(rows)} rows cannot hold eval_samples={cfg.eval_samples} held-out, "
                         f"student_samples={cfg.student_samples} student rows and a teacher part")
    return psrc, BlockWindow(psrc, 0, j), list(range(j, k)), list(range(k, n)), dcfg


def run_transfer(cfg: TransferConfig, out_dir: str | os.PathLike[str], *, device: torch.device | str = "cpu",
                 teacher: str | os.PathLike[str] | torch.nn.Module | None = None,
                 save_teacher_to: str | os.PathLike[str] | None = None, log: Any = None) -> dict[str, Any]:
    """Trains (or loads) the teacher, scores the student and held-out samples, trains the students.

    Args:
        cfg: the job.
        out_dir: score shards go to `out_dir/scores_student` and `out_dir/scores_eval`
            (a rerun resumes them; use a fresh directory for another teacher).
        device: where the teacher runs (and the students train).
        teacher: a trained GEMModel, or a `save_teacher` file; None: train one.
        save_teacher_to: write the teacher there after training.
        log: text stream for progress (default stderr).

    Returns:
        {"config", "teacher": {"train", "score", "tasks": {task: {"auc", "ne"}}}, "bayes": {task:
         {"auc", "ne"}}, "students": {method: {"tasks": {task: {"auc", "ne"}}, "runs": [...]}},
         "tasks": [...], "table": the printable per-task table, "objects": {"teacher", "students",
         "eval_set", "train_set", "sweep_sets": {N: ScoredSet}}}; with a sweep also "sweep": {N:
         {"students": like "students", "samples", "seeds"}} (N = student_samples included;
         "students" is its entry). "objects" holds the live models of student_samples (the
         bench measures them) and is not JSON.
    """
    t_start = time.perf_counter()
    deadline = t_start + cfg.time_budget if cfg.time_budget is not None else math.inf
    out = Path(out_dir)
    stream = log if log is not None else sys.stderr
    dev = torch.device(device)
    dcfg = data_config(cfg)
    source, t_source, s_blocks, e_blocks, features = _splits(cfg, dcfg)
    tasks = tuple(features.tasks)
    res: dict[str, Any] = {"config": dataclasses.asdict(cfg), "tasks": list(tasks)}

    # 1. teacher
    t0 = time.perf_counter()
    if teacher is None:
        torch.manual_seed(cfg.seed)
        model: torch.nn.Module = gem_model.GEMModel(teacher_config(cfg, features)).to(dev)
        t_secs = cfg.teacher_seconds
        if cfg.time_budget is not None:
            rest = _REST_SHARE_SWEEP if cfg.student_samples_sweep else _REST_SHARE
            left = deadline - time.perf_counter() - rest * cfg.time_budget
            t_secs = max(1.0, min(t_secs or math.inf, left))
        res["teacher_train"] = train_teacher(model, t_source, batch_blocks=cfg.teacher_batch_blocks,
                                             tokens_per_batch=cfg.teacher_tokens or None,
                                             lr=cfg.teacher_lr, table_lr=cfg.teacher_table_lr,
                                             max_samples=cfg.teacher_samples,
                                             max_seconds=t_secs, device=dev, seed=cfg.seed, log=stream)
        if save_teacher_to is not None:
            save_teacher(model, save_teacher_to)
    elif isinstance(teacher, torch.nn.Module):
        model = teacher.to(dev).eval()
        res["teacher_train"] = None
    else:
        model = load_teacher(teacher, device=dev)
        res["teacher_train"] = None
    res["teacher_params"] = sum(p.numel() for p in model.parameters())

    # 2. score the student and held-out samples (resumable score shards)
    res["score"] = {}
    for name, blocks in (("student", s_blocks), ("eval", e_blocks)):
        res["score"][name] = score_to_parquet(model, source, out / f"scores_{name}", blocks=blocks,
                                              blocks_per_shard=cfg.blocks_per_shard, device=dev,
                                              tasks=tasks, log=stream)
    train_set = ScoredSet.load(source, s_blocks, out / "scores_student")
    eval_set = ScoredSet.load(source, e_blocks, out / "scores_eval")
    if cfg.student_domain is not None:  # one surface's value model: its samples only
        train_set, eval_set = (x.take(np.flatnonzero(np.asarray(x.host.domain) == cfg.student_domain))
                               for x in (train_set, eval_set))
    labels = eval_set.labels
    res["teacher"] = evaluate(torch.sigmoid(eval_set.teacher_logits), labels, tasks)
    probs = eval_set.host.probs
    res["bayes"] = ({t: {"auc": v["auc"], "ne": v["ne"]} for t, v in
                     gem_data.bayes_metrics(torch.from_numpy(np.asarray(probs)), labels, tasks).items()}
                    if probs is not None else None)

    # 3. students: on the student samples and, with a sweep, on the first N of them for each N
    # (nested subsets; the same held-out set and seeds: paired across N)
    tables = teacher_tables(model) if any(m in ("sharing", "combined") for m in cfg.methods) else None
    plan = sweep_plan(cfg)
    if cfg.student_samples_sweep:  # the default N is then exactly student_samples, like every other N
        train_set = train_set.take(np.arange(cfg.student_samples))
    n_kd = len(cfg.distill.kd_weights)
    per = {m: n_kd if method_config(m, cfg.student, 1)[1] else 1 for m in cfg.methods}  # fits per student
    # each fit's time slice is proportional to its samples (KD-loss methods fit once per
    # candidate weight), so students of every N get about the same number of epochs
    work = sum(per[m] * k * n for n, k in plan.items() for m in cfg.methods)
    sweep: dict[int, dict[str, Any]] = {}
    sets: dict[int, ScoredSet] = {}
    live: dict[str, Any] = {}
    for n, seeds in plan.items():
        part = train_set if n == cfg.student_samples else train_set.take(np.arange(n))
        students: dict[str, Any] = {}
        for method in cfg.methods:
            runs = []
            for s in range(seeds):
                dc = dataclasses.replace(cfg.distill, seed=cfg.distill.seed + s)
                w = per[method] * n
                secs = None if cfg.time_budget is None else max(0.0, deadline - time.perf_counter()) * w / work
                st, info = train_student(method, part, features, student=cfg.student, train=dc,
                                         tables=tables, device=dev, max_seconds=secs)
                work -= w
                info["tasks"] = evaluate(predict(st, eval_set, device=dev), labels, tasks)
                runs.append(info)
                if n == cfg.student_samples:
                    live.setdefault(method, st)
            mean = {t: {k: float(np.mean([r["tasks"][t][k] for r in runs])) for k in ("auc", "ne")} for t in tasks}
            students[method] = {"tasks": mean, "runs": runs}
            at = f" ({len(part):,} samples)" if cfg.student_samples_sweep else ""
            print(f"student {method}{at}: " + ", ".join(f"{t} AUC {mean[t]['auc']:.4f}" for t in tasks),
                  file=stream, flush=True)
        sweep[n] = {"students": students, "samples": len(part), "seeds": seeds}
        sets[n] = part
    students = sweep[cfg.student_samples]["students"]
    res["students"] = students
    res["seconds"] = time.perf_counter() - t0
    if cfg.student_samples_sweep:
        res["sweep"] = sweep
    res["table"] = format_table(res)
    res["objects"] = {"teacher": model, "students": live, "eval_set": eval_set, "train_set": train_set,
                      "sweep_sets": sets}
    return res


def gains(res: dict[str, Any], students: dict[str, Any] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """{task: {method: {"auc", "ne", "gain", "vs_kd"}}}: gain = AUC - label-only AUC, vs_kd =
    gain / KD's gain (NaN without both baselines; KD's gain <= 0 gives inf/NaN, reported as is).
    `students`: another `res["students"]`-shaped dict (a sweep entry's); default res's."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    st = res["students"] if students is None else students
    for t in res["tasks"]:
        base = st["label_only"]["tasks"][t]["auc"] if "label_only" in st else math.nan
        kd_gain = st["kd"]["tasks"][t]["auc"] - base if "kd" in st else math.nan
        row: dict[str, dict[str, float]] = {}
        for m, v in st.items():
            g = v["tasks"][t]["auc"] - base
            ratio = g / kd_gain if kd_gain > 0 else math.nan
            row[m] = {"auc": v["tasks"][t]["auc"], "ne": v["tasks"][t]["ne"], "gain": g, "vs_kd": ratio}
        out[t] = row
    return out


def format_table(res: dict[str, Any]) -> str:
    """The per-task table: Bayes, teacher and every student's AUC / NE / gain / gain vs KD."""
    lines = []
    g = gains(res)
    for t in res["tasks"]:
        bayes = res["bayes"][t] if res.get("bayes") else {"auc": math.nan, "ne": math.nan}
        lines.append(f"task {t}: Bayes AUC {bayes['auc']:.4f} NE {bayes['ne']:.4f}; teacher AUC "
                     f"{res['teacher'][t]['auc']:.4f} NE {res['teacher'][t]['ne']:.4f}")
        lines.append(f"  {'method':<15} {'AUC':>7} {'NE':>7} {'gain':>8} {'gain/KD':>8}")
        for m, v in g[t].items():
            lines.append(f"  {m:<15} {v['auc']:7.4f} {v['ne']:7.4f} {v['gain']:+8.4f} {v['vs_kd']:8.2f}")
    return "\n".join(lines)
