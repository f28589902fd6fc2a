"""gem_data: the GEM input pipeline.

Jagged batches (`Batch`), a synthetic GEM-like source with a planted ground truth
(`SyntheticSource`, `bayes_metrics`), metrics (`auc`, `normalized_entropy`) and configs
(`DataConfig`, `gem_data.presets`), sharded Parquet (`write_parquet`, `ParquetSource`,
`DataError`), cost balancing across ranks (`shuffle_base_batches`, `token_budget_batches`,
`attention_cost`, `imbalance`) and the prefetching, resumable `JaggedLoader`.
"""
from gem_data import presets
from gem_data._batch import Batch, SparseFeatures
from gem_data._balance import attention_cost, imbalance, shuffle_base_batches, token_budget_batches
from gem_data._config import DataConfig
from gem_data._loader import JaggedLoader
from gem_data._checks import DataError
from gem_data._parquet import ParquetSource, write_parquet
from gem_data._metrics import auc, bayes_metrics, normalized_entropy
from gem_data._synthetic import SyntheticSource

__version__ = "0.2.0"
__all__ = [
    "Batch",
    "DataConfig",
    "DataError",
    "JaggedLoader",
    "ParquetSource",
    "SparseFeatures",
    "SyntheticSource",
    "attention_cost",
    "auc",
    "bayes_metrics",
    "imbalance",
    "normalized_entropy",
    "shuffle_base_batches",
    "token_budget_batches",
    "write_parquet",
    "__version__",
]
