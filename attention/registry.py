"""The registry of named attention backends and what each one supports.

A backend is a function ``run(q, k, v, pattern, scale) -> out`` on ``(B, S, H, D)`` tensors,
plus a declaration: the devices, dtypes and pattern kinds it handles, where it supports
autograd, and a probe saying whether it is usable on this machine at all (and if not, why).
Probes run lazily, the first time someone asks, and their answer is cached: importing
``vidgen.attention`` imports no optional kernel library.

The built-in backends (``sdpa``, ``flex``, ``flash``, ``xformers``) register themselves the
first time the registry is read; :func:`register_backend` adds others.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vidgen.attention.patterns import AttentionPattern, PatternKind

BackendFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, AttentionPattern, "float | None"], torch.Tensor
]

_BUILTIN_MODULES = (
    "vidgen.attention.backend_sdpa",
    "vidgen.attention.backend_flex",
    "vidgen.attention.backend_flash",
    "vidgen.attention.backend_xformers",
)


def _always_usable() -> str | None:
    return None


@dataclass(frozen=True)
class AttentionBackend:
    """A named attention implementation and the inputs it accepts."""

    name: str
    run: BackendFn
    """``run(q, k, v, pattern, scale)`` on (B, S, H, D) tensors, returning (B, S_q, H, D)."""
    devices: frozenset[str]
    """Device types it runs on, e.g. ``{"cpu", "cuda"}``."""
    dtypes: frozenset[torch.dtype]
    kinds: frozenset[PatternKind]
    grad_devices: frozenset[str] = frozenset()
    """Device types on which it supports backward (empty: inference only)."""
    probe: Callable[[], str | None] = _always_usable
    """Why the backend cannot be used on this machine (missing package, no GPU), or None."""
    description: str = ""

    def unusable_reason(self) -> str | None:
        """Why this backend is unusable on this machine, or None. Probed once, then cached."""
        if self.name in _PROBES:  # no lock once probed: torch.compile cannot trace one
            return _PROBES[self.name]
        with _LOCK:
            if self.name not in _PROBES:
                _PROBES[self.name] = self.probe()
            return _PROBES[self.name]

    def rejects(self, q: torch.Tensor, pattern: AttentionPattern, needs_grad: bool) -> str | None:
        """Why this backend cannot run these inputs (device, dtype, pattern, autograd), or None."""
        device = q.device.type
        if device not in self.devices:
            return f"{self.name} runs on {_names(self.devices)} tensors, not {device}"
        if q.dtype not in self.dtypes:
            return f"{self.name} supports dtypes {_names(self.dtypes)}, not {_dtype_name(q.dtype)}"
        if pattern.kind not in self.kinds:
            return f"{self.name} supports patterns {_names(self.kinds)}, not {pattern.kind.value}"
        if needs_grad and device not in self.grad_devices:
            where = (
                f"on {_names(self.grad_devices)} only" if self.grad_devices else "nowhere (inference only)"
            )
            return (
                f"{self.name} has no backward on {device} (autograd works {where}); "
                "use backend 'sdpa' for training, or run under torch.no_grad()"
            )
        return None


@dataclass(frozen=True)
class BackendStatus:
    """One line of :func:`backend_status`: is the backend usable here, and if not, why."""

    name: str
    usable: bool
    reason: str | None
    devices: tuple[str, ...]
    dtypes: tuple[str, ...]
    kinds: tuple[str, ...]
    grad_devices: tuple[str, ...]
    description: str

    def __str__(self) -> str:
        state = "usable" if self.usable else f"unusable: {self.reason}"
        return f"{self.name:<9} {state}"


_LOCK = threading.RLock()
_REGISTRY: dict[str, AttentionBackend] = {}
_PROBES: dict[str, str | None] = {}
_builtins_loaded = False


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _names(items) -> str:
    names = sorted(
        _dtype_name(i) if isinstance(i, torch.dtype) else getattr(i, "value", str(i)) for i in items
    )
    return ", ".join(names)


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:  # no lock once loaded: torch.compile cannot trace one
        return
    with _LOCK:
        if _builtins_loaded:
            return
        for module in _BUILTIN_MODULES:
            backend = importlib.import_module(module).BACKEND
            _REGISTRY.setdefault(backend.name, backend)
        _builtins_loaded = True


def register_backend(backend: AttentionBackend, *, replace: bool = False) -> AttentionBackend:
    """Add ``backend`` to the registry under ``backend.name``; returns it.

    Registering an existing name raises ``ValueError`` unless ``replace=True``.
    """
    _load_builtins()
    with _LOCK:
        if backend.name in _REGISTRY and not replace:
            raise ValueError(
                f"an attention backend named {backend.name!r} is already registered; pass replace=True"
            )
        _REGISTRY[backend.name] = backend
        _PROBES.pop(backend.name, None)
    return backend


def get_backend(name: str) -> AttentionBackend:
    """The backend registered as ``name``; ``ValueError`` listing the known names otherwise."""
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown attention backend {name!r}; known backends: {known}") from None


def registered_backends() -> list[str]:
    """Names of every registered backend, usable here or not."""
    _load_builtins()
    return sorted(_REGISTRY)


def available_backends() -> list[str]:
    """Names of the backends usable on this machine (installed, and their device present)."""
    return [name for name in registered_backends() if get_backend(name).unusable_reason() is None]


def backend_status() -> list[BackendStatus]:
    """Every registered backend, whether it is usable here and, if not, why (for ``vidgen info``)."""
    statuses = []
    for name in registered_backends():
        b = get_backend(name)
        reason = b.unusable_reason()
        statuses.append(
            BackendStatus(
                name=name,
                usable=reason is None,
                reason=reason,
                devices=tuple(sorted(b.devices)),
                dtypes=tuple(sorted(_dtype_name(d) for d in b.dtypes)),
                kinds=tuple(sorted(k.value for k in b.kinds)),
                grad_devices=tuple(sorted(b.grad_devices)),
                description=b.description,
            )
        )
    return statuses
