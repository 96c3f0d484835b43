"""Batched chunk steps: the transformer calls of several sessions made as one forward.

Each live session makes its chunks on its own thread (a page client's, a Serve compute thread).
Inside :meth:`StepBatcher.member` a thread's transformer calls (``ChunkDenoiser._call_model``) do
not run at once: they wait until every member thread is waiting on a call (or has finished its
chunk), and then the calls that can share a forward -- same model, latent shape, text length,
grad/inference/autocast mode and attention backend (:func:`batch_key`) -- run as one
:meth:`~vidgen.models.transformer.CausalWanTransformer.forward_many`, at most ``max_batch`` calls
at a time; each call keeps its own KV cache, positions, prompt, timestep and noise. A lone member
never waits. Every call waiting is taken in the same round, so no session waits more than one
round for another; the thread that completes the round runs it, the others sleep.

A batched call gives each session exactly the tensor it would get alone where the kernels compute
a row the same whatever the batch (measured on this project's CPU for the embedded model:
``tests/pipelines/test_batching.py``); otherwise the difference is that of a matmul's blocking.
A batched forward that fails is run again call by call, so one session's error stays its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from vidgen.attention.dispatch import chosen_backend

_LOCAL = threading.local()


def current_batcher() -> StepBatcher | None:
    """The batcher this thread is a member of, if any."""
    return getattr(_LOCAL, "batcher", None)


def _autocast_state(device_type: str) -> tuple[bool, torch.dtype | None]:
    if not torch.is_autocast_enabled(device_type):
        return False, None
    return True, torch.get_autocast_dtype(device_type)


def batch_key(model: Any, kwargs: dict[str, Any]) -> tuple | None:
    """What calls must share to be one forward; None: this call is never batched (a model
    without ``forward_many``, such as sequence parallelism's wrapper, a compiled model, an encoder
    prompt instead of a text context)."""
    if (
        getattr(type(model), "forward_many", None)
        is None  # a wrapper (sequence parallelism's) forwards only calls
        or kwargs.get("sequence_parallel") is not None
        or getattr(model, "_compiled_blocks", None) is not None
    ):
        return None
    text = kwargs.get("text_context")
    if text is None:
        return None
    x, timestep = kwargs["hidden_states"], kwargs["timestep"]
    extras = tuple(sorted((name, tuple(t.shape[1:]), t.dtype) for name, t in text.extras.items()))
    return (
        id(model),
        tuple(x.shape[1:]),
        x.dtype,
        str(x.device),
        timestep.ndim,
        tuple(timestep.shape[1:]),
        tuple(text.keys[0].shape[1:]),
        text.keys[0].dtype,
        extras,
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        _autocast_state(x.device.type),
        chosen_backend(),
    )


@dataclass(eq=False)  # compared by identity (its arguments hold tensors)
class _Pending:
    model: Any
    kwargs: dict[str, Any]
    key: tuple
    context: contextvars.Context
    result: torch.Tensor | None = None
    error: BaseException | None = None
    done: bool = False
    assigned: list[_Pending] | None = None
    """The calls of a forward this call's thread is to run."""


@dataclass
class BatchStats:
    """What a batcher did: forwards run and the calls they carried."""

    forwards: int = 0
    calls: int = 0
    rounds: int = 0
    sizes: dict[int, int] = field(default_factory=dict)
    """Calls per forward -> how many forwards carried that many."""

    @property
    def mean_batch(self) -> float:
        return self.calls / self.forwards if self.forwards else 0.0


class StepBatcher:
    """Makes the transformer calls of its member threads together (see the module's docstring)."""

    def __init__(self, max_batch: int = 8, lanes: int = 1) -> None:
        if max_batch < 1 or lanes < 1:
            raise ValueError(f"max_batch and lanes must be at least 1, got {max_batch} and {lanes}")
        self.max_batch = max_batch
        self.lanes = lanes
        """Forwards a round runs at once (each on the thread of one of its calls)."""
        self._cond = threading.Condition()
        self._members = 0
        self._blocked = 0
        self._waiting: list[_Pending] = []
        self._running = 0
        self.stats = BatchStats()

    @contextlib.contextmanager
    def member(self) -> Iterator[None]:
        """This thread's transformer calls join the batcher's rounds while inside."""
        if current_batcher() is self:  # nested: already a member
            yield
            return
        with self._cond:
            self._members += 1
        previous, _LOCAL.batcher = current_batcher(), self
        try:
            yield
        finally:
            _LOCAL.batcher = previous
            with self._cond:
                self._members -= 1
                self._cond.notify_all()  # the others may all be waiting now

    def call(self, model: Any, kwargs: dict[str, Any]) -> torch.Tensor:
        """``model(**kwargs)``'s output tensor, made in the next round with the other members' calls."""
        key = batch_key(model, kwargs)
        if key is None:
            return model(**kwargs, return_dict=False)[0]
        pending = _Pending(model, kwargs, key, contextvars.copy_context())
        cond = self._cond
        with cond:
            self._waiting.append(pending)
            self._blocked += 1
            try:
                while not pending.done:
                    if pending.assigned is not None:  # this thread runs a forward of the round
                        work, pending.assigned = pending.assigned, None
                        cond.release()
                        try:
                            self._run_forward(work)
                        finally:
                            cond.acquire()
                            self._running -= 1
                            cond.notify_all()
                    elif not self._running and self._waiting and self._blocked >= self._members:
                        self._start_round()
                    else:
                        cond.wait()
            finally:
                self._blocked -= 1
                if not pending.done:  # interrupted while waiting: leave nothing behind to wait on
                    self._abandon(pending)
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def _abandon(self, pending: _Pending) -> None:
        """A caller that leaves before its call is made (an interrupt; under the lock): its call
        leaves the queue, and a forward it was to run fails its other calls rather than never
        running."""
        if pending in self._waiting:
            self._waiting.remove(pending)
        if pending.assigned is not None:
            for other in pending.assigned:
                other.error = RuntimeError("the thread that was to run this batched call was interrupted")
                other.done = True
            pending.assigned = None
            self._running -= 1
        self._cond.notify_all()

    # ------------------------------------------------------------------ a round
    def _start_round(self) -> None:
        """Every waiting call into forwards (under the lock): calls that can share one are split
        into ``lanes`` forwards or more (at most ``max_batch`` calls each), each run by the thread
        of its first call, all at once."""
        batch, self._waiting = self._waiting, []
        groups: dict[tuple, list[_Pending]] = {}
        for pending in batch:
            groups.setdefault(pending.key, []).append(pending)
        self.stats.rounds += 1
        for group in groups.values():
            count = max(-(-len(group) // self.max_batch), min(self.lanes, len(group)))
            size, extra = divmod(len(group), count)
            start = 0
            for index in range(count):
                stop = start + size + (index < extra)
                group[start].assigned = group[start:stop]
                start = stop
                self._running += 1
        self._cond.notify_all()

    def _run_forward(self, calls: list[_Pending]) -> None:
        first = calls[0]
        try:
            outputs = first.context.run(
                _in_mode, first, lambda: first.model.forward_many([c.kwargs for c in calls])
            )
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            if len(calls) > 1:  # each call again on its own: an error stays its session's
                for pending in calls:
                    self._run_forward([pending])
                return
            first.error, first.done = err, True
            return
        with self._cond:
            self.stats.forwards += 1
            self.stats.calls += len(calls)
            self.stats.sizes[len(calls)] = self.stats.sizes.get(len(calls), 0) + 1
        for pending, output in zip(calls, outputs):
            pending.result, pending.done = output, True


def _in_mode(pending: _Pending, run: Any) -> Any:
    """``run()`` under the grad, inference and autocast modes the call was made in (they are
    per thread; the attention backend comes with the call's context)."""
    x = pending.kwargs["hidden_states"]
    grad, inference, (autocast, dtype) = pending.key[9], pending.key[10], pending.key[11]
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.set_grad_enabled(grad))
        if inference:
            stack.enter_context(torch.inference_mode())
        if autocast:
            stack.enter_context(torch.autocast(x.device.type, dtype=dtype))
        return run()


__all__ = ["BatchStats", "StepBatcher", "batch_key", "current_batcher"]
