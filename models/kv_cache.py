"""Self-attention KV cache for chunk-by-chunk generation: fixed sinks plus a sliding-window ring.

Memory is fixed at construction (``sink_frames + window_frames`` latent frames per layer) and does
not grow with the video. Frames ``< sink_frames`` go to the sink slots for good; every later frame
``f`` goes to ring slot ``sink_frames + (f - sink_frames) % window_frames``, overwriting the frame
that just left the window. Keys are stored *before* rotary embedding so that the model can give
them whatever positions its position scheme assigns (see ``vidgen.models.rope``).

Which frame sits in which slot is bookkeeping on the Python side (``slot_frames``): it depends only
on the frame indices the pipeline writes, so reading it never synchronises with the device, and
once the window is full every view has the same static shape.

The attention workspace (:meth:`KVCache.workspace`) holds, per layer, the held keys already rotated
followed by room for a chunk: ``[rotated held keys | new keys]`` and ``[held values | new values]``.
The sampler calls the model several times per chunk with the same cache and the same positions, so
the rotated prefix is made once per chunk instead of once per call and layer, and each call only
writes its chunk's keys into the tail: no re-rotation and no concatenation of the whole cache.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Collection, Iterator, Sequence

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from vidgen.models.rope import apply_rope


class KVCache(nn.Module):
    """Per-layer key/value buffers of shape (L, B, slots * frame_tokens, H, D)."""

    k: torch.Tensor  # registered buffers (nn.Module types its attributes as Tensor | Module)
    v: torch.Tensor

    def __init__(
        self,
        *,
        num_layers: int,
        batch_size: int,
        num_heads: int,
        head_dim: int,
        frame_tokens: int,
        sink_frames: int,
        window_frames: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        use_workspace: bool = True,
    ) -> None:
        super().__init__()
        self.use_workspace = use_workspace
        """Attend through :meth:`workspace` (False: rotate and concatenate the view in every call)."""
        if sink_frames < 0 or window_frames < 0 or sink_frames + window_frames == 0:
            raise ValueError(
                f"KVCache needs sink_frames >= 0, window_frames >= 0 and at least one slot; "
                f"got sink_frames={sink_frames}, window_frames={window_frames}"
            )
        self.num_layers = num_layers
        self.frame_tokens = frame_tokens
        self.sink_frames = sink_frames
        self.window_frames = window_frames
        self.capacity_frames = sink_frames + window_frames
        shape = (num_layers, batch_size, self.capacity_frames * frame_tokens, num_heads, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        # slot -> absolute latent frame held there, -1 when empty
        self.slot_frames: list[int] = [-1] * self.capacity_frames
        self._init_workspace()

    def _init_workspace(self) -> None:
        self.version = 0
        """Bumped whenever the held keys/values change (commit, reset): the workspace's staleness stamp."""
        self.workspace_refreshes = 0
        """How many times the rotated prefix was rebuilt (once per chunk when positions stay put)."""
        self._ws: tuple[torch.Tensor, torch.Tensor] | None = None
        self._ws_stamp: tuple | None = None

    # ---------------------------------------------------------------- bookkeeping
    def slot_of(self, frame: int) -> int | None:
        """Slot a frame is written to, or None when it is neither a sink nor kept by the window."""
        if frame < self.sink_frames:
            return frame
        if self.window_frames == 0:
            return None
        return self.sink_frames + (frame - self.sink_frames) % self.window_frames

    def frames_kept(self, frames) -> set[int]:
        """Which of ``frames`` the cache holds once all are written: the newest of each slot."""
        newest = {self.slot_of(frame): frame for frame in sorted(frames)}
        return {frame for slot, frame in newest.items() if slot is not None}

    @property
    def cached_frames(self) -> list[int]:
        """Absolute frame indices held, in slot order."""
        return [f for f in self.slot_frames if f >= 0]

    @property
    def num_cached_frames(self) -> int:
        return sum(f >= 0 for f in self.slot_frames)

    @property
    def next_frame(self) -> int:
        """One past the newest frame held (0 for an empty cache)."""
        return max(self.slot_frames) + 1

    def _valid_slots(self) -> list[int]:
        return [s for s, f in enumerate(self.slot_frames) if f >= 0]

    def reset(self, keep_sinks: bool = False) -> None:
        """Forget the held frames (``keep_sinks``: all but the sinks)."""
        self.slot_frames = [
            f if keep_sinks and s < self.sink_frames else -1 for s, f in enumerate(self.slot_frames)
        ]
        self.version += 1

    @contextlib.contextmanager
    def showing(self, frames: Collection[int]) -> Iterator[None]:
        """Inside, the cache shows attention only those of its frames that are in ``frames``;
        frames written inside are held afterwards beside the ones held before (except those whose
        slots they took)."""
        before = list(self.slot_frames)
        self.slot_frames = [f if f in frames else -1 for f in before]
        self.version += 1
        try:
            yield
        finally:
            self.slot_frames = [a if a >= 0 else b for a, b in zip(self.slot_frames, before)]
            self.version += 1

    def sinks_only(self) -> contextlib.AbstractContextManager[None]:
        """:meth:`showing` the sinks alone. The ``sinks`` context pass writes each chunk of context
        this way, so that a window frame's keys and values depend on the sinks and its own chunk
        alone, never on frames that have left the window: a resumed video can rebuild them exactly
        from the latents it holds."""
        return self.showing(range(self.sink_frames))

    # ---------------------------------------------------------------- reading
    # The bookkeeping is plain Python: under torch.compile it runs eagerly (a graph break), so the
    # compiled graphs never specialise on which frame sits in which slot.
    @torch.compiler.disable
    def view(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the held frames for ``layer``: (B, held_frames * frame_tokens, H, D)."""
        slots = self._valid_slots()
        if len(slots) == self.capacity_frames:
            return self.k[layer], self.v[layer]
        if slots == list(range(len(slots))):  # a filling cache holds a prefix of its slots
            end = len(slots) * self.frame_tokens
            return self.k[layer, :, :end], self.v[layer, :, :end]
        index = self._token_index(slots, self.k.device)
        return self.k[layer].index_select(1, index), self.v[layer].index_select(1, index)

    @torch.compiler.disable
    def frame_index(self, device: torch.device | None = None) -> torch.Tensor:
        """Absolute frame index of every held frame, in the order ``view`` returns them."""
        return torch.tensor(self.cached_frames, dtype=torch.long, device=device or self.k.device)

    def _token_index(self, slots: Sequence[int], device: torch.device) -> torch.Tensor:
        t = self.frame_tokens
        return torch.tensor([s * t + i for s in slots for i in range(t)], dtype=torch.long, device=device)

    # ---------------------------------------------------------------- writing
    @torch.compiler.disable
    def write(self, layer: int | slice, key: torch.Tensor, value: torch.Tensor, first_frame: int) -> None:
        """Store one layer's un-rotated ``key``/``value`` (B, F * frame_tokens, H, D) of frames
        ``first_frame .. first_frame + F - 1``; with ``layer`` a slice, the stacked keys/values of
        those layers, (L, B, F * frame_tokens, H, D). Call :meth:`commit` once all layers have written.
        Where two of the frames share a slot, the newer one is kept (as :meth:`commit` records)."""
        t = self.frame_tokens
        num_frames = key.shape[-3] // t
        # more frames than slots (a joint re-cache pass): the newest frame of each slot is kept
        newest = {self.slot_of(first_frame + i): i for i in range(num_frames)}
        kept = sorted((i, s) for s, i in newest.items() if s is not None)
        if not kept:
            return
        src = [i for i, _ in kept]
        dst = [s for _, s in kept]
        if src == list(range(src[0], src[0] + len(src))) and dst == list(range(dst[0], dst[0] + len(dst))):
            # contiguous frames into contiguous slots: a plain slice copy
            a, b = src[0] * t, (src[-1] + 1) * t
            c, d = dst[0] * t, (dst[-1] + 1) * t
            self.k[layer, :, c:d].copy_(key[..., a:b, :, :])
            self.v[layer, :, c:d].copy_(value[..., a:b, :, :])
            return
        src_index = self._token_index(src, key.device)
        dst_index = self._token_index(dst, key.device)
        self.k[layer].index_copy_(-3, dst_index, key.index_select(-3, src_index).to(self.k.dtype))
        self.v[layer].index_copy_(-3, dst_index, value.index_select(-3, src_index).to(self.v.dtype))

    def commit(self, first_frame: int, num_frames: int) -> None:
        """Record that frames ``first_frame .. first_frame + num_frames - 1`` are now held."""
        for frame in range(first_frame, first_frame + num_frames):
            slot = self.slot_of(frame)
            if slot is not None:
                self.slot_frames[slot] = frame
        self.version += 1

    # ---------------------------------------------------------------- attention workspace
    @torch.compiler.disable
    def workspace(
        self,
        cache_rope: torch.Tensor,
        stamp: object,
        new_tokens: int,
        dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(keys, values, held)``: (L, B, held + new_tokens, H, D) views whose first ``held`` tokens
        are the held keys rotated by ``cache_rope`` (and the held values), in :meth:`view` order.

        The prefix is rebuilt only when the held frames changed (:attr:`version`) or ``stamp`` (the
        caller's position scheme, e.g. the rope shift) did; the caller writes its new keys/values
        into ``[held, held + new_tokens)`` of its layer before attending. The buffers are sized for a
        full cache plus ``new_tokens`` once, so the shapes stop changing when the window is full.
        """
        held = self.num_cached_frames * self.frame_tokens
        need = held + new_tokens
        if (
            self._ws is None
            or self._ws[0].shape[2] < need
            or self._ws[0].dtype != dtype
            or self._ws[0].device != self.k.device
        ):
            layers, batch, _, heads, dim = self.k.shape
            size = max(need, self.capacity_frames * self.frame_tokens + new_tokens)
            shape = (layers, batch, size, heads, dim)
            self._ws = (
                torch.empty(shape, dtype=dtype, device=self.k.device),
                torch.empty(shape, dtype=dtype, device=self.k.device),
            )
            self._ws_stamp = None
        keys, values = self._ws
        if self._ws_stamp != (self.version, stamp):
            for layer in range(self.num_layers):  # layer by layer: no (L, ...) float32 temporaries
                k, v = self.view(layer)
                keys[layer, :, :held] = apply_rope(k.to(dtype), cache_rope)
                values[layer, :, :held] = v
            self._ws_stamp = (self.version, stamp)
            self.workspace_refreshes += 1
        return keys[:, :, :need], values[:, :, :need], held

    # ---------------------------------------------------------------- copies and files
    def clone(self) -> KVCache:
        copy = KVCache.__new__(KVCache)
        nn.Module.__init__(copy)
        for name in (
            "num_layers",
            "frame_tokens",
            "sink_frames",
            "window_frames",
            "capacity_frames",
            "use_workspace",
        ):
            setattr(copy, name, getattr(self, name))
        copy.register_buffer("k", self.k.clone(), persistent=False)
        copy.register_buffer("v", self.v.clone(), persistent=False)
        copy.slot_frames = list(self.slot_frames)
        copy._init_workspace()
        return copy

    def metadata(self) -> dict[str, str]:
        return {
            "format": "vidgen-kv-cache-1",
            "geometry": json.dumps(
                {
                    "num_layers": self.num_layers,
                    "frame_tokens": self.frame_tokens,
                    "sink_frames": self.sink_frames,
                    "window_frames": self.window_frames,
                    "shape": list(self.k.shape),
                    "dtype": str(self.k.dtype).removeprefix("torch."),
                }
            ),
            "slot_frames": json.dumps(self.slot_frames),
        }

    def save(self, path: str | os.PathLike, extra: dict[str, torch.Tensor] | None = None) -> None:
        """Write the held keys/values and slot map to a safetensors file (``extra`` tensors ride along)."""
        tensors = {"k": self.k.contiguous(), "v": self.v.contiguous()}
        for name, tensor in (extra or {}).items():
            tensors[f"extra.{name}"] = tensor.contiguous()
        save_file(tensors, os.fspath(path), metadata=self.metadata())

    @classmethod
    def load(
        cls, path: str | os.PathLike, device: torch.device | str | None = None
    ) -> tuple[KVCache, dict[str, torch.Tensor]]:
        """Read a file written by :meth:`save`; returns the cache and the ``extra`` tensors."""
        from safetensors import safe_open

        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"KV cache file not found: {path}")
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
        if meta.get("format") != "vidgen-kv-cache-1":
            raise ValueError(f"{path} is not a vidgen KV cache file (format={meta.get('format')!r})")
        geometry = json.loads(meta["geometry"])
        tensors = load_file(path, device=str(device or "cpu"))
        num_layers, batch, _, heads, head_dim = geometry["shape"]
        cache = cls(
            num_layers=num_layers,
            batch_size=batch,
            num_heads=heads,
            head_dim=head_dim,
            frame_tokens=geometry["frame_tokens"],
            sink_frames=geometry["sink_frames"],
            window_frames=geometry["window_frames"],
            dtype=getattr(torch, geometry["dtype"]),
            device=device,
        )
        cache.k.copy_(tensors["k"])
        cache.v.copy_(tensors["v"])
        cache.slot_frames = [int(f) for f in json.loads(meta["slot_frames"])]
        extra = {k.removeprefix("extra."): t for k, t in tensors.items() if k.startswith("extra.")}
        return cache, extra
