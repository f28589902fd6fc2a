"""gem_transfer: carries what the GEM teacher learned into small value models.

    from gem_transfer import run_transfer, presets
    res = run_transfer(presets.tiny(), "/tmp/transfer")   # teacher -> score shards -> students
    print(res["table"])

Teacher (`train_teacher`, `teacher_outputs`, `teacher_tables`, `save_teacher`, `load_teacher`);
teacher scoring (`score_to_parquet`, `read_scores`): per-task logits and the pooled
representation as Parquet score shards, streamed, sharded over ranks, resumable after kill -9;
students (`Student`, `StudentConfig`, `ScoredSet`, `train_student`, `DistillConfig`, METHODS):
pooled-embedding MLPs trained from labels, with distillation, the teacher's representation,
the teacher's tables, or all three; the whole job (`run_transfer`, `TransferConfig`,
`gem_transfer.presets.tiny/gem`).
"""
from gem_transfer import presets
from gem_transfer._distill import METHODS, DistillConfig, ScoredSet, train_student
from gem_transfer._pipeline import TransferConfig, run_transfer
from gem_transfer._scoring import read_scores, score_to_parquet
from gem_transfer._student import Student, StudentConfig
from gem_transfer._teacher import load_teacher, save_teacher, teacher_outputs, teacher_tables, train_teacher

__version__ = "0.3.0"
# `presets` (tiny, gem) is a submodule, like gem_data.presets; the names below are the API.
__all__ = [
    "METHODS",
    "DistillConfig",
    "ScoredSet",
    "Student",
    "StudentConfig",
    "TransferConfig",
    "load_teacher",
    "read_scores",
    "run_transfer",
    "save_teacher",
    "score_to_parquet",
    "teacher_outputs",
    "teacher_tables",
    "train_student",
    "train_teacher",
    "__version__",
]
