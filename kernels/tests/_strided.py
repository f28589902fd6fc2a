"""Offsets as a strided view, for the ops' "any stride" tests (test_jfa, test_gdpa, test_block)."""

import torch


def every_other(off: torch.Tensor) -> torch.Tensor:
    """`off`'s values as every other element of a twice-as-long buffer: equal, not contiguous."""
    buf = torch.zeros(2 * off.numel(), dtype=off.dtype, device=off.device)
    buf[::2] = off
    view = buf[::2]
    assert not view.is_contiguous() and torch.equal(view, off)
    return view
