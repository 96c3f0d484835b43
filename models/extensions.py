"""The embedded default model's additions to the Wan transformer, switched on by its config.

:class:`ConditionedWanTransformer` is :class:`~vidgen.models.transformer.CausalWanTransformer`
plus three parts of its own, each off unless its config key is set (``variant_keys``), each zero
when created so that a model resumed from a checkpoint without it computes what that checkpoint did:

* ``spatial_pos_grid=(rows, columns)``: a learned absolute position per token of the latent grid,
  added to the patch embedding -- the rotary embedding tells a token only its offsets to the
  others, and a small model on a small grid then does not know where the frame ends; other grid
  sizes interpolate the table;
* ``text_modulation``: a linear map of the prompt's mean token embedding added to every block's
  timestep modulation (shift, scale and gate of attention and feed-forward), a multiplicative path
  from the text besides the cross-attention's additive one;
* ``text_velocity``: a velocity (latent-grid rows and columns per latent frame) read from the prompt
  by attention pooling over its tokens; each block's self-attention head sees the tokens' spatial
  positions from a frame moving at its own learned multiple of it (:class:`MovingFrame`), so that
  "the object one step along the named way" is a fixed relative position for that head, as "the
  object where it was" is for a still one.

The parameter names are those the default model was trained and shipped with, so its weights load
as they are. A config that sets one of these keys builds this class
(:meth:`CausalWanTransformer.class_for`), whichever class it names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import register_to_config
from torch import nn

from vidgen.models.rope import WanRope, _axis_table, rotate_pairs_real
from vidgen.models.transformer import (
    CausalWanTransformer,
    SelfAttentionContext,
    SequenceParallel,
    TextContext,
)


class TextVelocity(nn.Module):
    """A velocity (B, 2), latent-grid rows and columns per latent frame, read from a prompt embedding
    (B, L, text_dim) by attention pooling over its tokens (the encoders zero the padding): one
    word such as "left" decides it, however long the prompt."""

    def __init__(self, text_dim: int) -> None:
        super().__init__()
        self.score = nn.Linear(text_dim, 1)
        self.value = nn.Linear(text_dim, 2)

    def forward(self, embedded: torch.Tensor) -> torch.Tensor:
        embedded = embedded.to(self.value.weight.dtype)
        present = embedded.abs().amax(dim=-1) > 0  # (B, L)
        score = self.score(embedded).squeeze(-1).masked_fill(~present, float("-inf"))
        weights = torch.softmax(score, dim=-1).nan_to_num(0.0)  # an all-padding prompt: no velocity
        return (weights[..., None] * self.value(embedded)).sum(dim=1)


def axis_frequencies(rope: WanRope, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(head_dim // 2,) float32 angular frequencies of the row and of the column axis, each zero
    on the other axes' channel pairs: a token's row angle on pair i is ``row * rows[i]``."""
    parts = [_axis_table(dim, 2, rope.theta)[1].float() for dim in rope.dims]
    zeros = [torch.zeros_like(part) for part in parts]
    rows = torch.cat([zeros[0], parts[1], zeros[2]])
    columns = torch.cat([zeros[0], zeros[1], parts[2]])
    return rows.to(device), columns.to(device)


def motion_phases(
    frequencies: tuple[torch.Tensor, torch.Tensor],
    frame_positions: torch.Tensor,
    frame_tokens: int,
    velocity: torch.Tensor,
) -> torch.Tensor:
    """Angles (B, frames * frame_tokens, head_dim // 2) that move each token's spatial position
    into a frame moving at ``velocity`` (B, 2): (rows, columns) per latent frame. A token at frame
    position t, row h, column w rotated by :class:`WanRope`'s rotation and then by these angles
    is rotated as one at (t, h - v_rows * t, w - v_columns * t) (:func:`apply_motion`).
    ``frequencies``: :func:`axis_frequencies`."""
    rows, columns = frequencies
    per_frame = velocity.float()[:, :1] * rows + velocity.float()[:, 1:] * columns  # (B, D/2)
    times = frame_positions.float().repeat_interleave(frame_tokens)  # (S,)
    return -times[None, :, None] * per_frame[:, None, :]


def apply_motion(x: torch.Tensor, phases: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    """Rotate the channel pairs of ``x`` (B, S, H, D) by ``gain`` (H,) times ``phases`` (B, S, D/2)
    (:func:`motion_phases`): each head sees positions in a frame moving at its own multiple of the
    velocity. Real multiplies only, so it compiles."""
    angles = phases[:, :, None, :] * gain.float()[None, None, :, None]  # (B, S, H, D/2)
    rotation = torch.stack((angles.cos(), angles.sin()), dim=-1)
    return rotate_pairs_real(x.float().unflatten(-1, (-1, 2)), rotation).flatten(-2).type_as(x)


@dataclass
class MovingFrame:
    """``text_velocity``'s rotation of the self-attention (``SelfAttentionContext.qk_transform``):
    per layer and head, queries and keys are rotated as if every token's spatial position were
    seen from a frame moving at ``gain[layer, head]`` times the prompt's velocity."""

    query: torch.Tensor  # (B, S, D/2) phases of this call's tokens
    keys: torch.Tensor  # (B, cached + S, D/2) phases of every key, cached frames first
    gain: torch.Tensor  # (L, H)

    def apply(self, query: torch.Tensor, key: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        gain = self.gain[layer]
        return apply_motion(query, self.query, gain), apply_motion(key, self.keys, gain)

    # sequence parallelism: the rotation is per token and per head, so a shard takes its part
    def sharded(self, shard: Callable[[torch.Tensor], torch.Tensor]) -> MovingFrame:
        """The rotation of one rank's tokens (ring attention): ``shard`` cuts a frame-major
        (B, frames * frame_tokens, ...) tensor to this rank's tokens of every frame; the keys are
        the cached frames' (sharded as the rank's cache holds them) followed by this call's."""
        cached = self.keys.shape[1] - self.query.shape[1]
        keys = torch.cat([shard(self.keys[:, :cached]), shard(self.keys[:, cached:])], dim=1)
        return MovingFrame(shard(self.query), keys, self.gain)

    def heads(self, start: int, stop: int) -> MovingFrame:
        """The rotation of heads ``start:stop`` only (Ulysses attention: a rank's share of them)."""
        return MovingFrame(self.query, self.keys, self.gain[:, start:stop])


class ConditionedWanTransformer(CausalWanTransformer):
    """The Wan transformer with the default model's additions (see the module's docstring)."""

    variant_keys = ("spatial_pos_grid", "text_modulation", "text_velocity")

    # the whole signature, the Wan class's first: diffusers reads a class's config keys from it
    @register_to_config
    def __init__(
        self,
        patch_size: tuple[int, int, int] = (1, 2, 2),
        num_attention_heads: int = 40,
        attention_head_dim: int = 128,
        in_channels: int = 16,
        out_channels: int = 16,
        text_dim: int = 4096,
        freq_dim: int = 256,
        ffn_dim: int = 13824,
        num_layers: int = 40,
        cross_attn_norm: bool = True,
        qk_norm: str | None = "rms_norm_across_heads",
        eps: float = 1e-6,
        image_dim: int | None = None,
        added_kv_proj_dim: int | None = None,
        rope_max_seq_len: int = 1024,
        pos_embed_seq_len: int | None = None,
        spatial_pos_grid: tuple[int, int] | None = None,
        text_modulation: bool = False,
        text_velocity: bool = False,
    ) -> None:
        super().__init__(
            patch_size, num_attention_heads, attention_head_dim, in_channels, out_channels, text_dim,
            freq_dim, ffn_dim, num_layers, cross_attn_norm, qk_norm, eps, image_dim, added_kv_proj_dim,
            rope_max_seq_len, pos_embed_seq_len,
        )  # fmt: skip
        dim = num_attention_heads * attention_head_dim
        # (1, D, 1, rows, columns), added to every frame's patch embedding
        self.spatial_pos = (
            nn.Parameter(torch.zeros(1, dim, 1, *spatial_pos_grid)) if spatial_pos_grid is not None else None
        )
        self.text_to_modulation = nn.Linear(text_dim, 6 * dim) if text_modulation else None
        if self.text_to_modulation is not None:
            nn.init.zeros_(self.text_to_modulation.weight)
            nn.init.zeros_(self.text_to_modulation.bias)
        self.text_to_velocity = TextVelocity(text_dim) if text_velocity else None
        self.velocity_gain = (
            nn.Parameter(torch.zeros(num_layers, num_attention_heads)) if text_velocity else None
        )
        self._frequencies: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _spatial_pos(self, rows: int, columns: int) -> torch.Tensor:
        """The position table for a grid of ``rows`` x ``columns`` tokens: as learned, or
        interpolated bilinearly (corners aligned) for another grid."""
        assert self.spatial_pos is not None
        table = self.spatial_pos
        if tuple(table.shape[-2:]) == (rows, columns):
            return table
        resized = F.interpolate(table[:, :, 0], size=(rows, columns), mode="bilinear", align_corners=True)
        return resized[:, :, None]

    # ------------------------------------------------------------------ the hooks
    def _embed_patches(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(hidden_states)  # (B, D, F, rows, columns)
        if self.spatial_pos is not None:
            x = x + self._spatial_pos(*x.shape[-2:]).to(x.dtype)
        return x

    def encode_text(self, encoder_hidden_states: torch.Tensor) -> TextContext:
        context = super().encode_text(encoder_hidden_states)
        if self.text_to_modulation is not None:
            # the mean of the prompt's tokens (the encoders zero the padding)
            embedded = encoder_hidden_states.to(self.text_to_modulation.weight.dtype)
            present = embedded.abs().amax(dim=-1, keepdim=True) > 0  # (B, L, 1)
            pooled = (embedded * present).sum(dim=1) / present.sum(dim=1).clamp(min=1)
            context.extras["modulation"] = self.text_to_modulation(pooled).unflatten(1, (6, -1))  # (B, 6, D)
        if self.text_to_velocity is not None:
            context.extras["velocity"] = self.text_to_velocity(encoder_hidden_states)  # (B, 2)
        return context

    def _text_modulation(self, modulation: torch.Tensor, text_context: TextContext) -> torch.Tensor:
        by_text = text_context.extras.get("modulation")
        if by_text is None:
            return modulation
        by_text = by_text.to(modulation.dtype)
        return modulation + (by_text[:, None] if modulation.ndim == 4 else by_text)

    def _attention_extras(
        self,
        ctx: SelfAttentionContext,
        text_context: TextContext,
        query_positions: torch.Tensor,
        cache_positions: torch.Tensor | None,
        frame_tokens: int,
        batch: int,
        sequence_parallel: SequenceParallel | None,
    ) -> None:
        velocity = text_context.extras.get("velocity")
        if velocity is None or self.velocity_gain is None:
            return
        device = query_positions.device
        if device not in self._frequencies:  # built once per device, as the rotary tables
            self._frequencies[device] = axis_frequencies(self.rope, device)
        frequencies = self._frequencies[device]
        velocity = velocity.expand(batch, -1)
        phases = motion_phases(frequencies, query_positions, frame_tokens, velocity)
        key_phases = phases
        if cache_positions is not None:
            key_phases = torch.cat(
                [motion_phases(frequencies, cache_positions, frame_tokens, velocity), phases], dim=1
            )
        ctx.qk_transform = MovingFrame(phases, key_phases, self.velocity_gain)
