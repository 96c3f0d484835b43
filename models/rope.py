"""3-D rotary position embedding of the Wan transformer, indexed by explicit frame positions.

Wan splits each head's channels into a temporal part and two spatial parts and rotates each part by
its own axis position (frame, row, column). diffusers' ``WanRotaryPosEmbed`` always uses frames
``0..F-1``; here the temporal positions are an argument, so a chunk generated against a KV cache
gets the positions the position scheme (:class:`RopePositionMode`) assigns it.

Position schemes for long videos
--------------------------------
``absolute``: a latent frame's temporal position is its index in the video. Exactly what a
whole-sequence forward uses, so chunked generation equals it; limited to ``rope_max_seq_len``
latent frames (1024 for Wan 2.1, about 4 minutes at 16 fps).

``rolling`` (the default for long videos): positions are assigned inside the attention context, as
if the retained frames were contiguous. Sink frames keep their positions ``0..sinks-1``; once the
sliding window has moved past them, every other frame is shifted down by
``shift = first_query_frame - window - sinks``, so the window sits right after the sinks and the
query chunk right after the window. Until the window first slides the two schemes are identical;
afterwards the distances between the query and the window are unchanged (RoPE only sees
differences), only the sinks move closer. Positions never exceed ``sinks + window + chunk``, so a
ten-minute or ten-hour video costs the same per chunk and stays inside the trained range.
"""

from __future__ import annotations

from enum import Enum

import torch
from torch import nn


class RopePositionMode(str, Enum):
    ABSOLUTE = "absolute"
    ROLLING = "rolling"


def axis_dims(head_dim: int) -> tuple[int, int, int]:
    """Channels per axis (t, h, w) of one head, as Wan 2.1 splits them."""
    h_dim = w_dim = 2 * (head_dim // 6)
    return head_dim - h_dim - w_dim, h_dim, w_dim


def _axis_table(dim: int, max_len: int, theta: float) -> torch.Tensor:
    # (max_len, dim // 2) angles in float64, the precision Wan's reference uses
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64)[: dim // 2] / dim))
    return torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)


class WanRope(nn.Module):
    """Cos/sin tables for the three axes; ``forward`` builds per-token rotations from positions.

    The tables are float32 and are built lazily per device rather than stored as buffers, so that
    casting the model to bf16 never degrades the rotation.
    """

    def __init__(self, head_dim: int, max_seq_len: int = 1024, theta: float = 10000.0) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.theta = theta
        self.dims = axis_dims(head_dim)
        self._tables: dict[torch.device, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}

    def tables(self, device: torch.device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if device not in self._tables:
            angles = [_axis_table(dim, self.max_seq_len, self.theta) for dim in self.dims]
            self._tables[device] = (
                [a.cos().float().to(device) for a in angles],
                [a.sin().float().to(device) for a in angles],
            )
        return self._tables[device]

    def forward(self, frame_positions: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Rotation for tokens laid out frame-major over ``(len(frame_positions), height, width)``.

        Returns the rotation (1, S, 1, head_dim // 2, 2): the cosine and sine of one angle per
        channel pair, the layout :func:`apply_rope` takes.
        """
        if height > self.max_seq_len or width > self.max_seq_len:
            raise ValueError(f"latent grid {height}x{width} exceeds rope_max_seq_len={self.max_seq_len}")
        device = frame_positions.device
        num_frames = frame_positions.shape[0]
        full = (num_frames, height, width)
        cos_tables, sin_tables = self.tables(device)
        parts_cos, parts_sin = [], []
        for cos_table, sin_table, index, shape in zip(
            cos_tables,
            sin_tables,
            (frame_positions, torch.arange(height, device=device), torch.arange(width, device=device)),
            ((num_frames, 1, 1), (1, height, 1), (1, 1, width)),
        ):
            dim = cos_table.shape[-1]
            parts_cos.append(cos_table[index].view(*shape, dim).expand(*full, dim))
            parts_sin.append(sin_table[index].view(*shape, dim).expand(*full, dim))
        half = self.head_dim // 2
        cos = torch.cat(parts_cos, dim=-1).reshape(1, num_frames * height * width, 1, half)
        sin = torch.cat(parts_sin, dim=-1).reshape(1, num_frames * height * width, 1, half)
        return torch.stack((cos, sin), dim=-1)


def apply_rope(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (2i, 2i+1) of ``x`` (B, S, H, D) by ``rotation`` (1, S, 1, D/2, 2), the
    cosine and sine of each pair's angle (:class:`WanRope`'s output)."""
    pairs = x.float().unflatten(-1, (-1, 2))  # (B, S, H, D/2, 2)
    if torch.compiler.is_compiling():  # Inductor generates no code for complex tensors
        rotated = rotate_pairs_real(pairs, rotation)
    else:  # one complex multiply, 4-10x faster than the real-valued form in eager mode
        rotated = torch.view_as_real(torch.view_as_complex(pairs) * torch.view_as_complex(rotation))
    return rotated.flatten(-2).type_as(x)


def rotate_pairs_real(pairs: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """:func:`apply_rope`'s rotation of (..., D/2, 2) channel pairs written with real multiplies
    (what it runs under ``torch.compile``)."""
    cos, sin = rotation.unbind(-1)
    x_even, x_odd = pairs.unbind(-1)
    return torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)


def rope_shift(first_query_frame: int, mode: RopePositionMode, sink_frames: int, window_frames: int) -> int:
    """How far non-sink frames are moved down for a query chunk at ``first_query_frame``."""
    if RopePositionMode(mode) == RopePositionMode.ABSOLUTE:
        return 0
    return max(0, first_query_frame - window_frames - sink_frames)


def frame_positions(frames: torch.Tensor, shift: int, sink_frames: int) -> torch.Tensor:
    """Temporal rope positions of absolute latent ``frames`` given a :func:`rope_shift`."""
    if shift == 0:
        return frames
    return torch.where(frames < sink_frames, frames, frames - shift)
