"""gem_kernels: jagged attention kernels (Triton) with plain-PyTorch references, and the
embedding tables' row-wise Adagrad update in one pass, and the rotary q/k/v projection's
gradient in one pass (`rope_qkv_grad`). `gem_kernels.precompile` compiles a run's Triton
kernels in parallel worker processes before the run reaches them.

Every attention op takes jagged values `[T, H, D]` + int64 offsets `[B+1]` + host-int max
lengths; every op offers `backend="auto" | "triton" | "reference"`. The attention ops are
registered with `torch.library`.
"""

from gem_kernels._jagged import pad_jagged, unpad_jagged
from gem_kernels._jfa import jagged_flash_attention, jagged_flash_attention_kv, jfa_backward_rule
from gem_kernels._jfa_qkv import jagged_flash_attention_qkv
from gem_kernels._gdpa import generalized_dot_product_attention
from gem_kernels._block import block_attention
from gem_kernels._rowwise_adagrad import rowwise_adagrad_, rowwise_adagrad_reference_
from gem_kernels._rope import rope, rope_qkv_grad
from gem_kernels._gluon_jfa import use_gluon_jfa

__version__ = "0.3.16"

# One import line and one entry per op, so op files merge without conflicts.
__all__ = [
    "__version__",
    "block_attention",
    "generalized_dot_product_attention",
    "jagged_flash_attention",
    "jagged_flash_attention_kv",
    "jagged_flash_attention_qkv",
    "jfa_backward_rule",
    "pad_jagged",
    "rope",
    "rope_qkv_grad",
    "rowwise_adagrad_",
    "rowwise_adagrad_reference_",
    "unpad_jagged",
    "use_gluon_jfa",
]
