"""The ten CUDA driver calls the copy-engine path needs, through ctypes (no compiled code).

Why the driver API and not `Tensor.copy_`: a `copy_` whose source lives on another GPU runs
on the *source* device's current stream and adds a two-way event barrier with the
destination device's stream (ATen `copy_device_to_device`), and `rebuild_cuda_tensor`
opens a peer's IPC handle on the peer's device, creating a second CUDA context there. Raw
`cuMemcpyAsync` on a stream we choose (UVA infers the direction) and `cuIpcOpenMemHandle`
in our own context avoid both. Device-side signalling uses stream memory operations
(`cuStreamWriteValue32` / `cuStreamWaitValue32`): the GPU's front end writes and polls a flag,
no SM is used and the host never waits — this replaces the per-call store barriers.

Every call is checked; a failure raises `RuntimeError` naming the call and the driver error.
Callers make the right device current first (`torch.cuda.device(...)`).
"""

from __future__ import annotations

import ctypes
from typing import Any

IPC_HANDLE_BYTES = 64  # CU_IPC_HANDLE_SIZE
_LAZY_ENABLE_PEER_ACCESS = 0x1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
_WAIT_GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ: (int32)(*addr - value) >= 0, wrap-safe
_WRITE_DEFAULT = 0x0  # CU_STREAM_WRITE_VALUE_DEFAULT: a memory fence precedes the write


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


_u64, _u32, _size, _ptr = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p
# name (first existing symbol wins) -> argtypes. CUresult is an int; streams are pointers.
_SIGNATURES: dict[tuple[str, ...], list[Any]] = {
    ("cuGetErrorName",): [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
    ("cuMemAlloc_v2",): [ctypes.POINTER(_u64), _size],
    ("cuMemFree_v2",): [_u64],
    ("cuMemsetD32_v2",): [_u64, _u32, _size],
    ("cuMemsetD32Async",): [_u64, _u32, _size, _ptr],
    ("cuIpcGetMemHandle",): [ctypes.POINTER(_IpcHandle), _u64],
    ("cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"): [ctypes.POINTER(_u64), _IpcHandle, ctypes.c_uint],
    ("cuIpcCloseMemHandle",): [_u64],
    ("cuMemcpyAsync",): [_u64, _u64, _size, _ptr],
    ("cuStreamWriteValue32_v2", "cuStreamWriteValue32"): [_ptr, _u64, _u32, ctypes.c_uint],
    ("cuStreamWaitValue32_v2", "cuStreamWaitValue32"): [_ptr, _u64, _u32, ctypes.c_uint],
}
_fns: dict[str, Any] = {}


def _load() -> dict[str, Any]:
    if _fns:
        return _fns
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise RuntimeError(f"gem_comms copy_engine needs the CUDA driver (libcuda.so.1): {e}") from e
    for names, argtypes in _SIGNATURES.items():
        fn = next((getattr(lib, n) for n in names if hasattr(lib, n)), None)
        if fn is None:
            raise RuntimeError(f"gem_comms copy_engine: the CUDA driver lacks {names[0]} (too old?)")
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
        _fns[names[0]] = fn
    return _fns


def _call(name: str, *args: Any) -> None:
    fns = _load()
    res = fns[name](*args)
    if res != 0:
        msg = ctypes.c_char_p()
        fns["cuGetErrorName"](res, ctypes.byref(msg))
        raise RuntimeError(f"gem_comms copy_engine: {name} failed with CUDA error {res} "
                           f"({(msg.value or b'?').decode()})")


def mem_alloc(nbytes: int) -> int:
    """A dedicated device allocation (its own IPC handle) in the current context."""
    ptr = _u64()
    _call("cuMemAlloc_v2", ctypes.byref(ptr), max(nbytes, 4))
    return int(ptr.value)


def mem_free(ptr: int) -> None:
    _call("cuMemFree_v2", ptr)


def memset32(ptr: int, value: int, count: int) -> None:
    """Synchronous fill of `count` uint32 words (flags start at 0 before they are shared)."""
    _call("cuMemsetD32_v2", ptr, value, count)


def memset32_async(ptr: int, value: int, count: int, stream: int) -> None:
    """Fill of `count` uint32 words on `stream` (the caller waits for it with a deadline)."""
    _call("cuMemsetD32Async", ptr, value, count, stream)


def ipc_handle(ptr: int) -> bytes:
    h = _IpcHandle()
    _call("cuIpcGetMemHandle", ctypes.byref(h), ptr)
    return bytes(h)  # the raw 64 bytes (`h.reserved` would stop at the first NUL)


def ipc_open(handle: bytes) -> int:
    """Maps a peer's allocation into the *current* context (no context on the peer's GPU)."""
    h = _IpcHandle.from_buffer_copy(handle)
    ptr = _u64()
    _call("cuIpcOpenMemHandle_v2", ctypes.byref(ptr), h, _LAZY_ENABLE_PEER_ACCESS)
    return int(ptr.value)


def ipc_close(ptr: int) -> None:
    _call("cuIpcCloseMemHandle", ptr)


def copy(dst: int, src: int, nbytes: int, stream: int) -> None:
    """One DMA copy on `stream` (a `cudaStream_t` as int); source or destination may be a peer's."""
    if nbytes:
        _call("cuMemcpyAsync", dst, src, nbytes, stream)


def write_flag(addr: int, value: int, stream: int) -> None:
    """After everything before it on `stream` (with a memory fence): `*addr = value`."""
    _call("cuStreamWriteValue32_v2", stream, addr, value & 0xFFFFFFFF, _WRITE_DEFAULT)


def wait_flag(addr: int, value: int, stream: int) -> None:
    """Work after this on `stream` starts once `*addr >= value` (wrap-safe comparison)."""
    _call("cuStreamWaitValue32_v2", stream, addr, value & 0xFFFFFFFF, _WAIT_GEQ)
