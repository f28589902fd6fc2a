"""gem_comms: collectives whose intra-node data movement runs on CUDA copy engines.

Drop-in for `torch.distributed.all_gather_into_tensor`, `reduce_scatter_tensor` and
`all_to_all_single` (same signatures, plus keyword `backend=` and `timeout=`), with
`async_op=True` returning a `CommHandle`. See README.md for which collectives stay on SMs.
"""

from gem_comms._api import (
    Backend,
    all_gather_into_tensor,
    all_to_all_single,
    reduce_scatter_tensor,
    release_buffers,
    resolve_backend,
)
from gem_comms._handle import CommHandle
from gem_comms._overlap import Prefetcher, overlap_all_gather
from gem_comms._validate import BACKENDS

__version__ = "0.2.1"
__all__ = [
    "BACKENDS",
    "Backend",
    "CommHandle",
    "Prefetcher",
    "__version__",
    "all_gather_into_tensor",
    "all_to_all_single",
    "overlap_all_gather",
    "reduce_scatter_tensor",
    "release_buffers",
    "resolve_backend",
]
