"""gem_transfer: carries what the GEM teacher learned into small value models.

    from gem_transfer import run_transfer, tiny, format_table
    res = run_transfer(tiny(), "/tmp/transfer")       # teacher -> score shards -> students
    print(format_table(res))

Teacher scoring (`score_to_parquet`, `read_scores`): per-task logits and the pooled
representation as Parquet score shards, streamed, sharded over ranks, resumable after kill -9.
Students (`Student`, `StudentConfig`, `train_student`, METHODS): pooled-embedding MLPs trained
from labels, with distillation, the teacher's representation, the teacher's tables, or all.
"""
from gem_transfer._distill import METHODS, DistillConfig, ScoredSet, train_student
from gem_transfer._pipeline import TransferConfig, format_table, gem, run_transfer, tiny
from gem_transfer._scoring import read_scores, score_to_parquet
from gem_transfer._student import Student, StudentConfig
from gem_transfer._teacher import load_teacher, save_teacher, teacher_outputs
from gem_transfer._window import BlockWindow

__version__ = "0.1.0"
__all__ = [
    "METHODS",
    "BlockWindow",
    "DistillConfig",
    "ScoredSet",
    "Student",
    "StudentConfig",
    "TransferConfig",
    "format_table",
    "load_teacher",
    "read_scores",
    "run_transfer",
    "save_teacher",
    "score_to_parquet",
    "teacher_outputs",
    "train_student",
    "__version__",
]
