"""The one entry point for attention: validate inputs, pick a backend, run it.

Layout: every tensor is ``(B, S, H, D)`` (batch, sequence, heads, head dim), as flash-attn and
xformers use natively; backends that want ``(B, H, S, D)`` transpose internally. ``q`` may be
shorter than ``k``/``v``: queries are then the last positions of the key sequence (see
:mod:`vidgen.attention.patterns`).

Which backend runs is resolved in this order:

1. the ``backend=`` argument of :func:`dispatch_attention`;
2. the innermost ``with attention_backend(name):`` block;
3. the ``VIDGEN_ATTENTION_BACKEND`` environment variable;
4. the automatic choice (:func:`auto_backend`).

A choice made by 1-3 is obeyed or fails loudly: an unknown name raises ``ValueError`` listing
the known ones, and a backend that cannot run the inputs (not installed, wrong device, dtype
or pattern, no backward) raises :class:`BackendUnavailableError` saying why.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar

import torch

from vidgen.attention.patterns import AttentionPattern
from vidgen.attention.registry import AttentionBackend, get_backend

ENV_VAR = "VIDGEN_ATTENTION_BACKEND"

_FULL = AttentionPattern.full()
_CHOSEN: ContextVar[str | None] = ContextVar("vidgen_attention_backend", default=None)


class BackendUnavailableError(RuntimeError):
    """The requested attention backend cannot run here; the message says why."""


@contextlib.contextmanager
def attention_backend(name: str | None) -> Iterator[None]:
    """Use backend ``name`` for :func:`dispatch_attention` calls inside the block (None: back to automatic).

    Overrides ``VIDGEN_ATTENTION_BACKEND``; an explicit ``backend=`` argument still wins.
    Unknown names fail at the ``with`` line.
    """
    if name is not None:
        get_backend(name)
    token = _CHOSEN.set(name)
    try:
        yield
    finally:
        _CHOSEN.reset(token)


@torch.compiler.assume_constant_result
def _chosen_by_context() -> str | None:
    # torch.compile cannot trace ContextVar.get: a compiled graph keeps the choice it was traced under
    return _CHOSEN.get()


def chosen_backend() -> str | None:
    """The backend ``attention_backend(...)`` chose in this context (None: automatic)."""
    return _CHOSEN.get()


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    tensors = {"q": q, "k": k, "v": v}

    def shapes() -> str:  # only for a message: str.join would break a torch.compile graph
        return ", ".join(f"{n} {tuple(t.shape)}" for n, t in tensors.items())

    if any(t.dim() != 4 for t in tensors.values()):
        raise ValueError(f"q, k and v must be 4-D (B, S, H, D); got {shapes()}")
    for axis, label in ((0, "batch (B)"), (2, "heads (H)"), (3, "head dim (D)")):
        if len({t.shape[axis] for t in tensors.values()}) > 1:
            raise ValueError(f"q, k and v disagree on {label}, axis {axis} of (B, S, H, D): {shapes()}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same sequence length (axis 1 of (B, S, H, D)): {shapes()}")
    if len({t.dtype for t in tensors.values()}) > 1:
        dtypes = ", ".join(f"{n} {t.dtype}" for n, t in tensors.items())
        raise ValueError(f"q, k and v must share a dtype; got {dtypes}")
    if len({t.device for t in tensors.values()}) > 1:
        devices = ", ".join(f"{n} {t.device}" for n, t in tensors.items())
        raise ValueError(f"q, k and v must be on one device; got {devices}")
    if not q.dtype.is_floating_point:
        raise ValueError(f"attention needs floating-point tensors, got {q.dtype}")


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def auto_backend(
    q: torch.Tensor, kv_len: int, pattern: AttentionPattern, needs_grad: bool
) -> AttentionBackend:
    """The automatic choice.

    * CUDA: ``flash`` > ``flex`` > ``sdpa``, the first that is usable and accepts the inputs
      (flash-attn needs fp16/bf16).
    * CPU: ``sdpa``. Every sparse pattern (block-causal, sliding-window, radial) runs there
      blockwise, linear in length, measured as fast as compiled flex on CPU, with a backward
      (radial inference runs as log-sum-exp-merged rectangles: 2.4x dense at the Wan-1.3B chunk,
      compiled flex 0.8x).
    """
    order: tuple[str, ...]
    if q.device.type == "cuda":
        order = ("flash", "flex", "sdpa")
    else:
        order = ("sdpa",)
    reasons = []
    for name in order:
        backend = get_backend(name)
        reason = backend.unusable_reason() or backend.rejects(q, pattern, needs_grad)
        if reason is None:
            return backend
        reasons.append(reason)
    raise BackendUnavailableError("no attention backend can run these inputs: " + "; ".join(reasons))


def select_backend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pattern: AttentionPattern | None = None,
    backend: str | None = None,
) -> AttentionBackend:
    """The backend :func:`dispatch_attention` would run for these inputs (see the module docstring)."""
    pattern = pattern or _FULL
    needs_grad = _needs_grad(q, k, v)
    for name, source in (
        (backend, "the backend= argument"),
        (_chosen_by_context(), "attention_backend(...)"),
        (os.environ.get(ENV_VAR) or None, f"${ENV_VAR}"),
    ):
        if name is None:
            continue
        chosen = get_backend(name)
        reason = chosen.unusable_reason() or chosen.rejects(q, pattern, needs_grad)
        if reason is not None:
            raise BackendUnavailableError(
                f"attention backend {name!r} (chosen by {source}) cannot run here: {reason}"
            )
        return chosen
    return auto_backend(q, k.shape[1], pattern, needs_grad)


def dispatch_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    pattern: AttentionPattern | None = None,
    backend: str | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention of ``q`` over ``k``/``v`` under ``pattern``.

    Args:
        q: (B, S_q, H, D) queries; when ``S_q < S_kv`` they are the last ``S_q`` positions.
        k, v: (B, S_kv, H, D) keys and values.
        pattern: which keys each query sees; None means full attention.
        backend: a registered backend name, overriding the context manager, the environment
            variable and the automatic choice.
        scale: softmax scale; None means ``1 / sqrt(D)``.

    Returns:
        (B, S_q, H, D), in the dtype of ``q``.
    """
    _check_inputs(q, k, v)
    pattern = pattern or _FULL
    pattern.check_lengths(q.shape[1], k.shape[1])
    chosen = select_backend(q, k, v, pattern, backend)
    return chosen.run(q, k, v, pattern, scale)  # (B, S_q, H, D)
