"""gem_data: the GEM input pipeline.

Jagged batches (`Batch`), a synthetic GEM-like source with a planted ground truth
(`SyntheticSource`, `bayes_metrics`), metrics (`auc`, `normalized_entropy`) and configs
(`DataConfig`, `gem_data.presets`).
"""
from gem_data import presets
from gem_data._batch import Batch, SparseFeatures
from gem_data._config import DataConfig
from gem_data._metrics import auc, bayes_metrics, normalized_entropy
from gem_data._synthetic import SyntheticSource

__version__ = "0.1.0"
__all__ = [
    "Batch",
    "DataConfig",
    "SparseFeatures",
    "SyntheticSource",
    "auc",
    "bayes_metrics",
    "normalized_entropy",
    "presets",
    "__version__",
]
