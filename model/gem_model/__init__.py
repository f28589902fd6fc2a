"""gem_model: InterFormer + Kunlun blocks, the GEM-like multi-domain multi-task model, FLOPs.

    from gem_model import GEMModel, presets
    model = GEMModel(presets.tiny(**presets.feature_sizes(data_cfg)))
    logits = model(batch)            # [B, num_tasks]
    model.flops(batch)["total"]      # analytic forward FLOPs for this batch's jagged lengths
"""

from gem_model import presets
from gem_model._config import GEMConfig
from gem_model._layers import (
    GDPAFFN,
    InterFormerLayer,
    PersonalizedFFN,
    SeqAttention,
    SeqPooling,
)
from gem_model._baselines import LogisticRegression, PooledMLP
from gem_model._embedding import sparse_table_grads
from gem_model._model import GEMModel, TaskHeads

__version__ = "0.6.5"

__all__ = [
    "GDPAFFN",
    "GEMConfig",
    "GEMModel",
    "InterFormerLayer",
    "LogisticRegression",
    "PooledMLP",
    "PersonalizedFFN",
    "SeqAttention",
    "SeqPooling",
    "TaskHeads",
    "__version__",
    "presets",
    "sparse_table_grads",
]
