"""Triton Jagged Flash Attention (work in progress: the kernels land in the next commit)."""

import torch


def jfa_forward(q, k, v, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, window, scale):  # type: ignore[no-untyped-def]
    raise NotImplementedError("backend='triton' for jagged_flash_attention is not built yet")


def jfa_backward(dout, q, k, v, out, lse, q_offsets, kv_offsets, max_q_len, max_kv_len, causal, window, scale):  # type: ignore[no-untyped-def]
    raise NotImplementedError("backend='triton' for jagged_flash_attention is not built yet")
