"""The async handle every collective returns with `async_op=True`.

One type wraps the two things a collective can be waiting on: a `torch.distributed.Work`
(NCCL, gloo) or a CUDA event recorded on a copy-engine side stream. `wait()` has
`torch.distributed` semantics for CUDA (the *current stream* is ordered after the collective,
the host is not blocked) and blocks the host for CPU work; with `timeout=` the host polls
and raises `TimeoutError` instead of hanging.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist


def _seconds(timeout: float | timedelta | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    if not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"{timeout=} must be a non-negative number of seconds or a timedelta")
    return float(timeout)


class CommHandle:
    """Handle of an in-flight collective (`async_op=True`).

    Attributes:
        backend: the backend that ran the collective ("copy_engine", "nccl", "gloo").
    """

    def __init__(
        self,
        backend: str,
        *,
        work: dist.Work | None = None,
        event: torch.cuda.Event | None = None,
        device: torch.device | None = None,
        keep: tuple[torch.Tensor, ...] = (),
        timeout: float | timedelta | None = None,
        on_timeout: Callable[[], None] | None = None,
    ) -> None:
        self.backend = backend
        self._timeout = _seconds(timeout)  # the collective's `timeout=`: wait()'s default
        self._work = work
        self._event = event
        self._device = device
        # The tensors stay referenced until wait(): the caller may drop them meanwhile.
        self._keep = keep
        self._waited = False
        self._waiter: threading.Thread | None = None
        self._waiter_error: BaseException | None = None
        # Told when wait() gives up: the copy-engine group then knows a lane may stay stuck on
        # a flag, so releasing it leaks its buffers instead of waiting for (or freeing under) it.
        self._on_timeout = on_timeout

    def is_completed(self) -> bool:
        """True once the transfer has finished (non-blocking query; some gloo Works only
        report completion once waited on)."""
        waited = self._waiter is not None and not self._waiter.is_alive()
        if self._work is not None and not (self._work.is_completed() or waited):
            return False
        if self._event is not None and not self._event.query():  # type: ignore[no-untyped-call]
            return False
        return True

    def wait(self, timeout: float | timedelta | None = None) -> bool:
        """Orders the caller after the collective.

        For CUDA tensors the current stream waits (the host does not block); for CPU tensors
        the host blocks until the data is there.

        Args:
            timeout: seconds (or a timedelta) the host is willing to wait for completion;
                `None` takes the collective's own `timeout=`; if that was None too there is no
                host-side limit (CUDA: the current stream is ordered, the host does not block).

        Raises:
            TimeoutError: the collective did not complete within `timeout`. The group is then
                in an unknown state (a peer is missing); see `release_buffers`.
        """
        limit = _seconds(timeout) if timeout is not None else self._timeout
        if limit is not None:
            deadline = time.monotonic() + limit
            cuda_work = self._device is not None and self._device.type == "cuda"
            pause = 1e-5
            while cuda_work and self._work is not None and not self._work.is_completed():
                # NCCL: Work.wait() only orders streams, so poll the completion instead.
                if time.monotonic() >= deadline:
                    self._raise_timeout(limit)
                time.sleep(pause)
                pause = min(pause * 2, 1e-2)
            if not cuda_work and self._work is not None and not self._work.is_completed():
                # Some Works (e.g. gloo reduce-scatter) only report completion from wait(),
                # so a helper thread waits and the caller joins it with the deadline.
                if self._waiter is None:
                    self._waiter = threading.Thread(target=self._wait_work, daemon=True)
                    self._waiter.start()
                self._waiter.join(max(0.0, deadline - time.monotonic()))
                if self._waiter.is_alive():
                    self._raise_timeout(limit)
                if self._waiter_error is not None:
                    raise self._waiter_error
            pause = 1e-5
            while self._event is not None and not self._event.query():  # type: ignore[no-untyped-call]
                if time.monotonic() >= deadline:
                    self._raise_timeout(limit)
                time.sleep(pause)
                pause = min(pause * 2, 1e-2)
        if self._work is not None:
            self._work.wait()
        if self._event is not None:
            torch.cuda.current_stream(self._device).wait_event(self._event)
        self._keep = ()
        self._waited = True
        return True

    def _wait_work(self) -> None:
        assert self._work is not None
        try:
            self._work.wait()
        except BaseException as e:  # re-raised in the caller's thread
            self._waiter_error = e

    def _raise_timeout(self, limit: float) -> None:
        if self._on_timeout is not None:
            self._on_timeout()
        raise TimeoutError(
            f"gem_comms {self.backend} collective did not complete within "
            f"timeout={limit} s (a peer rank may not have joined it); call release_buffers() "
            "on every rank before reusing the group"
        )

    def __repr__(self) -> str:
        return f"CommHandle(backend={self.backend!r}, completed={self.is_completed()})"
