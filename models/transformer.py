"""The causal Wan 2.1 transformer: diffusers-compatible weights, chunk-by-chunk generation.

``CausalWanTransformer`` has the parameter names, shapes and config of diffusers'
``WanTransformer3DModel`` (text-to-video), so a directory written by diffusers loads into it, and
called the same way (full attention) it returns the same tensor. On top of that it runs causally:

* ``timestep`` may be per latent frame, (B, F), for diffusion forcing;
* ``attention_pattern`` restricts self-attention (block-causal by chunk, sliding window + sinks, ...);
* with ``kv_cache``, ``hidden_states`` is one chunk (or a few) starting at latent frame
  ``frame_offset``; its queries attend to the cached frames and to itself, and with
  ``update_cache=True`` its keys/values are written into the cache for the chunks that follow;
* ``text_context`` (from :meth:`CausalWanTransformer.encode_text`) carries the cross-attention keys
  and values of a prompt, computed once and reused for every step and chunk;
* ``sequence_parallel`` runs the blocks on this process's shard of the tokens (see
  :class:`SequenceParallel`; the implementation is ``vidgen.distributed``).

Token layout: patches are flattened frame-major, (B, F * H' * W', D); a latent frame has
``H' * W'`` tokens (``H' = H / patch_h``). Nothing here hard-codes a geometry: it comes from the
config and the input's shape.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.loaders import PeftAdapterMixin
from diffusers.models.modeling_outputs import Transformer2DModelOutput
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from vidgen.attention import AttentionPattern, available_backends, dispatch_attention
from vidgen.models import wan_checkpoint
from vidgen.models.kv_cache import KVCache
from vidgen.models.rope import (
    RopePositionMode,
    WanRope,
    apply_rope,
    frame_positions,
    rope_shift,
)

# ----------------------------------------------------------------------------- small modules
# Attribute names follow diffusers so that state dicts are interchangeable.


class FP32LayerNorm(nn.LayerNorm):
    """LayerNorm computed in float32 whatever the input dtype (as Wan does)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight.float() if self.weight is not None else None
        bias = self.bias.float() if self.bias is not None else None
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).to(x.dtype)


class RMSNorm(nn.RMSNorm):
    """RMSNorm whose weight follows the input's dtype: under bf16 autocast the fused kernel runs
    instead of a slower mixed-dtype fallback."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight.to(x.dtype), self.eps)


class Linear(nn.Linear):
    """``nn.Linear`` that, in inference under autocast, casts its float32 weight and bias to the
    autocast dtype once and keeps the cast, instead of on every call as autocast does.

    The output is bitwise that of ``nn.Linear`` under autocast (the same cast, the same matmul). On
    a small model on the CPU the per-call cast is a large share of a linear layer's time: the
    default model's denoising passes take ~12 % less time. The cast is remade when the weight changes
    (another tensor, or an in-place update that bumps its version) and on :func:`drop_cast_weights`
    (the pipeline calls it at each video's start, for updates through ``.data`` that bump no
    version, such as a LoRA fused in place). It costs half the float32 weights' memory while kept.
    Training (gradients on), other weight dtypes, quantized weights and ``torch.compile`` take the
    plain path.
    """

    _cast: tuple[tuple, torch.Tensor, torch.Tensor | None] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        device = x.device.type
        if (
            weight.dtype is not torch.float32
            or not torch.is_autocast_enabled(device)
            or (weight.requires_grad and torch.is_grad_enabled())
            or type(weight) is not nn.Parameter
            or torch.compiler.is_compiling()
        ):
            return F.linear(x, weight, self.bias)
        dtype = torch.get_autocast_dtype(device)
        bias = self.bias
        key = (
            dtype,
            weight.data_ptr(),
            weight._version,
            None if bias is None else (bias.data_ptr(), bias._version),
        )
        cast = self._cast
        if cast is None or cast[0] != key:
            with torch.no_grad():
                cast = (key, weight.to(dtype), None if bias is None else bias.to(dtype))
            self._cast = cast
        return F.linear(x, cast[1], cast[2])


def drop_cast_weights(model: nn.Module) -> None:
    """Forget every :class:`Linear`'s kept cast in ``model`` (they are remade on the next call)."""
    for module in model.modules():
        if isinstance(module, Linear):
            module._cast = None


class _GeluProj(nn.Module):
    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.proj = Linear(dim_in, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x), approximate="tanh")


class FeedForward(nn.Module):
    """Linear -> GELU(tanh) -> Linear, stored as ``net.0.proj`` / ``net.2``."""

    def __init__(self, dim: int, inner_dim: int) -> None:
        super().__init__()
        self.net = nn.ModuleList([_GeluProj(dim, inner_dim), nn.Dropout(0.0), Linear(inner_dim, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.net:
            x = layer(x)
        return x


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels: int, dim: int) -> None:
        super().__init__()
        self.linear_1 = Linear(in_channels, dim)
        self.linear_2 = Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class TextProjection(nn.Module):
    def __init__(self, in_features: int, dim: int) -> None:
        super().__init__()
        self.linear_1 = Linear(in_features, dim)
        self.linear_2 = Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.gelu(self.linear_1(x), approximate="tanh"))


def sinusoidal_embedding(timesteps: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """(N,) -> (N, dim), cos half first (diffusers ``Timesteps(flip_sin_to_cos=True, shift=0)``)."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=timesteps.device) / half
    )
    angles = timesteps.float()[:, None] * freqs[None]
    emb = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
    return F.pad(emb, (0, 1)) if dim % 2 else emb


class ConditionEmbedder(nn.Module):
    def __init__(self, dim: int, freq_dim: int, text_dim: int) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.time_embedder = TimestepEmbedding(freq_dim, dim)
        self.time_proj = Linear(dim, dim * 6)
        self.text_embedder = TextProjection(text_dim, dim)

    def embed_time(self, timestep: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(N,) -> time embedding (N, D) and block modulation (N, 6, D)."""
        emb = sinusoidal_embedding(timestep.flatten(), self.freq_dim)
        emb = emb.to(self.time_embedder.linear_1.weight.dtype)
        temb = self.time_embedder(emb).to(dtype)
        return temb, self.time_proj(F.silu(temb)).unflatten(1, (6, -1))


# ----------------------------------------------------------------------------- attention


class Attention(nn.Module):
    """Wan attention: q/k/v projections, RMSNorm over all heads on q and k, output projection."""

    def __init__(self, dim: int, heads: int, eps: float, is_cross_attention: bool) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.is_cross_attention = is_cross_attention
        self.to_q = Linear(dim, dim)
        self.to_k = Linear(dim, dim)
        self.to_v = Linear(dim, dim)
        self.to_out = nn.ModuleList([Linear(dim, dim), nn.Dropout(0.0)])
        self.norm_q = RMSNorm(dim, eps=eps)
        self.norm_k = RMSNorm(dim, eps=eps)

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normalised, not rotated) and values: (B, S, H, D) each."""
        key = self.norm_k(self.to_k(x)).unflatten(2, (self.heads, -1))
        value = self.to_v(x).unflatten(2, (self.heads, -1))
        return key, value

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm_q(self.to_q(x)).unflatten(2, (self.heads, -1))  # (B, S, H, D)

    def output(self, attended: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return self.to_out[0](attended.flatten(2, 3).type_as(like))


@dataclass
class TextContext:
    """Cross-attention keys/values of a prompt for every block: computed once, reused per step.
    ``extras``: per-sample tensors (B, ...) a model variant reads from the prompt besides them
    (:mod:`vidgen.models.extensions`); empty for Wan."""

    keys: list[torch.Tensor]  # per block, (B, L, H, D)
    values: list[torch.Tensor]
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def select(self, index: torch.Tensor | slice) -> TextContext:
        return TextContext(
            [k[index] for k in self.keys],
            [v[index] for v in self.values],
            {name: extra[index] for name, extra in self.extras.items()},
        )

    @staticmethod
    def cat(contexts: list[TextContext]) -> TextContext:
        """Batch several contexts (e.g. conditional and unconditional for guidance)."""
        blocks = range(len(contexts[0].keys))
        return TextContext(
            [torch.cat([c.keys[i] for c in contexts]) for i in blocks],
            [torch.cat([c.values[i] for c in contexts]) for i in blocks],
            {name: torch.cat([c.extras[name] for c in contexts]) for name in contexts[0].extras},
        )


@dataclass
class SelfAttentionContext:
    """What every block's self-attention needs for one forward call.

    Rotations and the pattern always describe the whole call (every token of the chunk, frame-major),
    also when the blocks run on a shard of it: a :class:`SequenceParallel` takes the part it needs.
    """

    rope: torch.Tensor  # query/new-key rotation (1, S, 1, D/2, 2)
    pattern: AttentionPattern | None
    kv_cache: KVCache | None = None
    cache_rope: torch.Tensor | None = None  # rotation of cached keys
    write_frame: int | None = None  # first latent frame to write into the cache, None: read only
    frame_tokens: int = 0  # tokens per latent frame in the blocks' input (per-frame modulation)
    # the blocks' self-attention in place of attend: sequence parallelism's, or forward_many's (each
    # call's own); None: attend, over every token
    parallel: AttentionHook | None = None
    # what the cached keys' rotation depends on besides the held frames (KVCache.workspace);
    # None: rotate and concatenate the cache view in every layer
    cache_stamp: tuple | None = None
    # KVCache.workspace's (keys, values, held), fetched once per call before the blocks run, so the
    # blocks touch no cache bookkeeping (nothing for torch.compile to break its graph on)
    workspace: tuple[torch.Tensor, torch.Tensor, int] | None = None
    # with a workspace and a cache write: (L, B, S, H, D) un-rotated keys and values of this call,
    # filled by the blocks and written into the cache once they have all run
    staged: tuple[torch.Tensor, torch.Tensor] | None = None
    # a model variant's extra transform of the rotated queries and keys, ``apply(query, keys,
    # layer) -> (query, keys)``, with ``sharded(shard)`` (a ring rank's tokens) and ``heads(start,
    # stop)`` (a Ulysses rank's heads) for sequence parallelism (vidgen.models.extensions); None for Wan
    qk_transform: Any = None


class AttentionHook(Protocol):
    """What the blocks call for self-attention in place of :func:`attend` (``SelfAttentionContext.parallel``)."""

    def attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        ctx: SelfAttentionContext,
        layer: int,
    ) -> torch.Tensor: ...


class SequenceParallel(AttentionHook, Protocol):
    """Hooks that run the blocks on one process's shard of the tokens (sequence parallelism).

    The model calls them at three places: after patch embedding (:meth:`shard`), for every
    self-attention (:meth:`attention`) and before unpatchifying (:meth:`gather`). Everything else
    -- projections, cross-attention, feed-forward, (per-frame) modulation -- is per token and runs on
    the shard unchanged. ``vidgen.distributed.SequenceParallelGroup`` implements it; the model does
    not import that package.
    """

    def cache_frame_tokens(self, frame_tokens: int) -> int:
        """Tokens per latent frame that this process's KV cache holds."""

    def shard(self, tokens: torch.Tensor, frame_tokens: int) -> torch.Tensor:
        """This process's part of frame-major ``tokens`` (B, F * frame_tokens, ...): still frame-major,
        the same number of tokens of every frame."""

    def attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        ctx: SelfAttentionContext,
        layer: int,
    ) -> torch.Tensor:
        """Self-attention of this shard's un-rotated (B, S_shard, H, D) tensors, as :func:`attend`
        computes it for the whole sequence; returns (B, S_shard, H, D)."""

    def gather(self, tokens: torch.Tensor, frame_tokens: int) -> torch.Tensor:
        """The inverse of :meth:`shard`: every process gets all the tokens, frame-major."""


def attend(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, ctx: SelfAttentionContext, layer: int
) -> torch.Tensor:
    """Self-attention of un-rotated (B, S, H, D) queries/keys/values over the cached frames and
    themselves; writes the keys/values into the cache when ``ctx.write_frame`` is set (with a
    workspace: stages them in ``ctx.staged``, for the caller to write after the last block)."""
    query = apply_rope(query, ctx.rope)
    new_key = apply_rope(key, ctx.rope)
    if ctx.workspace is not None:  # the cache is rotated once per chunk: write this call's tail
        keys, values, held = ctx.workspace
        all_key, all_value = keys[layer], values[layer]  # (B, held + S, H, D)
        all_key[:, held:].copy_(new_key)
        all_value[:, held:].copy_(value)
        if ctx.staged is not None:  # into the cache after the last block
            ctx.staged[0][layer].copy_(key)
            ctx.staged[1][layer].copy_(value)
    elif ctx.kv_cache is None:
        all_key, all_value = new_key, value
    else:
        all_key, all_value = _cache_and_new(key, value, new_key, ctx, layer)
    if ctx.qk_transform is not None:  # a new tensor: the workspace's rotated keys stay as they are
        query, all_key = ctx.qk_transform.apply(query, all_key, layer)
    out = dispatch_attention(query, all_key, all_value, pattern=ctx.pattern)
    if ctx.workspace is None and ctx.kv_cache is not None and ctx.write_frame is not None:
        ctx.kv_cache.write(layer, key, value, ctx.write_frame)  # only now: it may overwrite slots read above
    return out


def _cache_and_new(key, value, new_key, ctx: SelfAttentionContext, layer: int):
    """[rotated cache view | new keys] and [cache view | new values], concatenated for this call."""
    cache, cache_rope = ctx.kv_cache, ctx.cache_rope
    assert cache is not None and cache_rope is not None  # attention against a cache sets both
    cached_key, cached_value = cache.view(layer)  # views into the buffers
    all_key, all_value = new_key, value
    if cached_key.shape[1]:
        all_key = torch.cat([apply_rope(cached_key.to(key.dtype), cache_rope), new_key], dim=1)
        all_value = torch.cat([cached_value.to(value.dtype), value], dim=1)
    return all_key, all_value


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, frame_tokens: int) -> torch.Tensor:
    """x * (1 + scale) + shift with per-sample (B, D) or per-frame (B, F, D) modulation; x (B, S, D)."""
    if shift.ndim == 2:
        return x * (1 + scale[:, None]) + shift[:, None]
    x = x.unflatten(1, (-1, frame_tokens))  # (B, F, T, D)
    return (x * (1 + scale[:, :, None]) + shift[:, :, None]).flatten(1, 2)


def _gate(x: torch.Tensor, gate: torch.Tensor, frame_tokens: int) -> torch.Tensor:
    if gate.ndim == 2:
        return x * gate[:, None]
    return (x.unflatten(1, (-1, frame_tokens)) * gate[:, :, None]).flatten(1, 2)


class CausalWanBlock(nn.Module):
    def __init__(self, dim: int, ffn_dim: int, heads: int, cross_attn_norm: bool, eps: float) -> None:
        super().__init__()
        self.norm1 = FP32LayerNorm(dim, eps, elementwise_affine=False)
        self.attn1 = Attention(dim, heads, eps, is_cross_attention=False)
        self.attn2 = Attention(dim, heads, eps, is_cross_attention=True)
        self.norm2 = FP32LayerNorm(dim, eps, elementwise_affine=True) if cross_attn_norm else nn.Identity()
        self.ffn = FeedForward(dim, ffn_dim)
        self.norm3 = FP32LayerNorm(dim, eps, elementwise_affine=False)
        self.scale_shift_table = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def self_attention(self, x: torch.Tensor, ctx: SelfAttentionContext, layer: int) -> torch.Tensor:
        attn = self.attn1
        query = attn.project_q(x)
        key, value = attn.project_kv(x)  # un-rotated: the cache stores them like this
        attention = attend if ctx.parallel is None else ctx.parallel.attention
        return attn.output(attention(query, key, value, ctx, layer), x)

    def cross_attention(self, x: torch.Tensor, text: TextContext, layer: int) -> torch.Tensor:
        query = self.attn2.project_q(x)
        out = dispatch_attention(query, text.keys[layer].to(query.dtype), text.values[layer].to(query.dtype))
        return self.attn2.output(out, x)

    def forward(
        self,
        x: torch.Tensor,
        modulation: torch.Tensor,
        text: TextContext,
        ctx: SelfAttentionContext,
        layer: int,
    ) -> torch.Tensor:
        # modulation: (B, 6, D) per sample or (B, F, 6, D) per latent frame
        table = self.scale_shift_table if modulation.ndim == 3 else self.scale_shift_table[:, None]
        shift_msa, scale_msa, gate_msa, c_shift, c_scale, c_gate = (table + modulation.float()).unbind(-2)
        t = ctx.frame_tokens

        h = _modulate(self.norm1(x.float()), shift_msa, scale_msa, t).type_as(x)
        x = (x.float() + _gate(self.self_attention(h, ctx, layer), gate_msa, t)).type_as(x)

        x = x + self.cross_attention(self.norm2(x.float()).type_as(x), text, layer)

        h = _modulate(self.norm3(x.float()), c_shift, c_scale, t).type_as(x)
        return (x.float() + _gate(self.ffn(h).float(), c_gate, t)).type_as(x)


def run_blocks(
    blocks: nn.ModuleList,
    x: torch.Tensor,
    modulation: torch.Tensor,
    text: TextContext,
    ctx: SelfAttentionContext,
) -> torch.Tensor:
    """All ``blocks`` on the tokens ``x`` (B, S, D): the region ``compile_blocks`` compiles."""
    for layer, block in enumerate(blocks):
        x = block(x, modulation, text, ctx, layer)
    return x


@dataclass
class _Call:
    """One forward call between its preparation and its finish (:meth:`CausalWanTransformer._prepare`)."""

    x: torch.Tensor  # (B, S, D) patch embeddings
    temb: torch.Tensor
    modulation: torch.Tensor
    text: TextContext
    ctx: SelfAttentionContext
    kv_cache: KVCache | None
    update_cache: bool
    frame_offset: int
    batch: int
    frames: int
    grid_h: int
    grid_w: int
    frame_tokens: int
    sequence_parallel: SequenceParallel | None


class _EachCall:
    """The self-attention of several calls run as one batch (:meth:`CausalWanTransformer.forward_many`):
    the projections, cross-attention and feed-forward see every call's tokens at once, the
    attention is each call's own (its cache, positions, pattern), run in turn on its rows. Plugged
    in where sequence parallelism plugs its attention (``SelfAttentionContext.parallel``)."""

    def __init__(self, contexts: list[SelfAttentionContext], sizes: list[int]) -> None:
        self.contexts = contexts
        self.sizes = sizes

    def attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        ctx: SelfAttentionContext,
        layer: int,
    ) -> torch.Tensor:
        parts = zip(query.split(self.sizes), key.split(self.sizes), value.split(self.sizes), self.contexts)
        return torch.cat([attend(q, k, v, own, layer) for q, k, v, own in parts])


# ----------------------------------------------------------------------------- the model


class CausalWanTransformer(ModelMixin, ConfigMixin, PeftAdapterMixin):  # type: ignore[misc]  # diffusers' two config_name
    """Wan 2.1 text-to-video transformer that also runs chunk by chunk against a KV cache.

    The config is diffusers' ``WanTransformer3DModel`` config (same argument names); image
    conditioning (I2V: ``image_dim``/``added_kv_proj_dim``) is not supported. This class computes
    Wan 2.1 and nothing else. A model variant that adds to it (the embedded default model's
    learned grid positions, text modulation and text velocity: :mod:`vidgen.models.extensions`) is
    a subclass that declares its config keys (``variant_keys``) and overrides the hooks below
    (``_embed_patches``, ``encode_text``, ``_text_modulation``, ``_attention_extras``); a config
    that sets any of those keys builds and loads that class (``CausalWanTransformer(**config)``
    and ``from_pretrained`` alike). LoRA adapters load
    through diffusers' ``PeftAdapterMixin`` (``load_lora_adapter``, ``set_adapters``, ``fuse_lora``,
    ``unfuse_lora``, ``unload_lora``), as into ``WanTransformer3DModel``; :mod:`vidgen.models.lora`
    brings other published layouts to its keys.
    """

    _supports_gradient_checkpointing = True
    # diffusers declares these None in ModelMixin, so their type there is None
    _no_split_modules = ["CausalWanBlock"]  # type: ignore[assignment]
    _keep_in_fp32_modules = ["time_embedder", "scale_shift_table", "norm1", "norm2", "norm3"]  # type: ignore[assignment]
    _skip_layerwise_casting_patterns = ["patch_embedding", "condition_embedder", "norm"]  # type: ignore[assignment]
    config: Any  # diffusers' FrozenDict of the __init__ arguments, read as attributes (typed there as a dict)
    variant_keys: tuple[str, ...] = ()
    """A variant's own config keys: set in a config, they select that class."""
    _variants: list[type[CausalWanTransformer]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.variant_keys:
            CausalWanTransformer._variants.append(cls)

    @classmethod
    def class_for(cls, config: dict) -> type[CausalWanTransformer]:
        """The class a config builds: a variant whose keys it sets (truthy), else this one."""
        if cls is CausalWanTransformer:
            import vidgen.models.extensions  # noqa: F401  (registers the default model's variant)

            for variant in cls._variants:
                if any(config.get(key) for key in variant.variant_keys):
                    return variant
        return cls

    def __new__(cls, *args: Any, **kwargs: Any) -> CausalWanTransformer:
        return super().__new__(cls.class_for(kwargs))

    @classmethod
    def from_config(cls, config: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]  # diffusers returns a tuple with return_unused_kwargs
        """diffusers' ``from_config``, building the class the config asks for (:meth:`class_for`)."""
        variant = cls.class_for(dict(config or {}))
        if variant is not cls:
            return variant.from_config(config, **kwargs)
        return super().from_config(config, **kwargs)

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
    ) -> None:
        super().__init__()
        if image_dim is not None or added_kv_proj_dim is not None or pos_embed_seq_len is not None:
            raise ValueError(
                "image-conditioned Wan checkpoints (I2V: image_dim / added_kv_proj_dim) are not supported; "
                "use a text-to-video checkpoint"
            )
        if qk_norm not in ("rms_norm_across_heads", None):
            raise ValueError(f"qk_norm={qk_norm!r} is not supported (only 'rms_norm_across_heads')")
        patch_size = cast("tuple[int, int, int]", tuple(patch_size))  # config.json holds a list
        dim = num_attention_heads * attention_head_dim
        self.inner_dim = dim
        self.rope = WanRope(attention_head_dim, rope_max_seq_len)
        self.patch_embedding = nn.Conv3d(in_channels, dim, kernel_size=patch_size, stride=patch_size)
        self.condition_embedder = ConditionEmbedder(dim, freq_dim, text_dim)
        self.blocks = nn.ModuleList(
            [
                CausalWanBlock(dim, ffn_dim, num_attention_heads, cross_attn_norm, eps)
                for _ in range(num_layers)
            ]
        )
        self.norm_out = FP32LayerNorm(dim, eps, elementwise_affine=False)
        self.proj_out = Linear(dim, (out_channels or in_channels) * math.prod(patch_size))
        self.scale_shift_table = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)
        self.gradient_checkpointing = False
        self._compiled_blocks: Any = None  # compile_blocks()

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(  # type: ignore[override]  # local weights only: a path is required
        cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any
    ) -> CausalWanTransformer:
        """Load local weights: a diffusers directory (``WanTransformer3DModel.save_pretrained``, also
        sharded, or a pipeline folder with ``subfolder="transformer"``), or a directory / ``.safetensors``
        file in the original Wan 2.1 key layout. Never downloads and never unpickles."""
        path = Path(pretrained_model_name_or_path).expanduser()
        if kwargs.get("subfolder"):
            path = path / kwargs["subfolder"]
        if not path.exists():
            raise FileNotFoundError(
                f"no checkpoint at {path}: vidgen never downloads weights; pass a local directory or .safetensors file"
            )
        files = wan_checkpoint.safetensors_files(path)
        if not wan_checkpoint.is_original_layout(wan_checkpoint.checkpoint_keys(files)):
            kwargs.pop("config_overrides", None)  # a diffusers folder brings its own config
            kwargs.update(use_safetensors=True, local_files_only=True)
            config_file = (path if path.is_dir() else path.parent) / "config.json"
            own = json.loads(config_file.read_text()) if config_file.is_file() else {}
            variant = cls.class_for(own)  # the class the folder's config asks for
            if variant is not cls:
                return variant.from_pretrained(pretrained_model_name_or_path, **kwargs)
            return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

        state = wan_checkpoint.convert_original_state_dict(wan_checkpoint.load_state_dict(files))
        config = wan_checkpoint.config_from_original(path, state, kwargs.pop("config_overrides", None))
        with torch.device("meta"):
            model = cls(**config)
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        if missing or unexpected:
            raise ValueError(
                f"{path} does not match a Wan 2.1 transformer: missing {missing[:3]}, unexpected {unexpected[:3]}"
            )
        dtype = kwargs.get("torch_dtype")
        return model.to(dtype=dtype).eval() if dtype is not None else model.eval()

    # ------------------------------------------------------------------ geometry
    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype, as diffusers' ``ModelMixin.dtype`` answers it, without its walk over
        every submodule (~10 ms on the default model, and the denoiser asks on every call).

        Layerwise casting hooks the blocks' linear layers (the embeddings, norms and output
        projection are skipped), and then its compute dtype is the answer; otherwise it is the
        first floating weight not kept in float32, which is the patch embedding's.
        """
        for module in self.blocks[0].modules():
            registry = getattr(module, "_diffusers_hook", None)
            casting = registry.get_hook("layerwise_casting") if registry is not None else None
            if casting is not None:
                return casting.compute_dtype
        return self.patch_embedding.weight.dtype

    def latent_grid(self, height: int, width: int) -> tuple[int, int]:
        """Tokens per latent frame along (rows, columns) for a latent of ``height`` x ``width``."""
        _, p_h, p_w = self.config.patch_size
        if height % p_h or width % p_w:
            raise ValueError(f"latent size {height}x{width} is not divisible by the patch size {p_h}x{p_w}")
        return height // p_h, width // p_w

    def frame_tokens(self, height: int, width: int) -> int:
        grid_h, grid_w = self.latent_grid(height, width)
        return grid_h * grid_w

    def make_kv_cache(
        self,
        *,
        batch_size: int,
        latent_height: int,
        latent_width: int,
        sink_frames: int,
        window_frames: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        num_heads: int | None = None,
        frame_tokens: int | None = None,
    ) -> KVCache:
        """A cache sized from this model's config for latents of the given size. ``num_heads`` and
        ``frame_tokens`` replace the config's for a rank that holds a shard of them (sequence
        parallelism)."""
        c = self.config
        return KVCache(
            num_layers=c.num_layers,
            batch_size=batch_size,
            num_heads=num_heads or c.num_attention_heads,
            head_dim=c.attention_head_dim,
            frame_tokens=frame_tokens or self.frame_tokens(latent_height, latent_width),
            sink_frames=sink_frames,
            window_frames=window_frames,
            dtype=dtype or self.dtype,
            device=device or self.device,
        )

    # ------------------------------------------------------------------ text
    def encode_text(self, encoder_hidden_states: torch.Tensor) -> TextContext:
        """Project a prompt embedding (B, L, text_dim) to every block's cross-attention K/V."""
        text = self.condition_embedder.text_embedder(encoder_hidden_states.to(self.dtype))
        keys, values = [], []
        for block in cast("list[CausalWanBlock]", self.blocks):
            k, v = block.attn2.project_kv(text)
            keys.append(k)
            values.append(v)
        return TextContext(keys, values)

    # ------------------------------------------------------------------ forward
    def _attention_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype of the self-attention keys: autocast's when it is on, else the compute dtype."""
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        return self.dtype

    # ------------------------------------------------------------------ variant hooks
    # A model variant overrides these (vidgen.models.extensions); for Wan they add nothing.
    def _embed_patches(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(B, C, F, H, W) latents -> (B, D, F, rows, columns) patch embeddings."""
        return self.patch_embedding(hidden_states)

    def _text_modulation(self, modulation: torch.Tensor, text_context: TextContext) -> torch.Tensor:
        """The blocks' modulation, (B, 6, D) or (B, F, 6, D), with the prompt's share added."""
        return modulation

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
        """Set a variant's own part of the self-attention context (``ctx.qk_transform``)."""

    def compile_blocks(self, mode: str | None = None, dynamic: bool | None = False) -> None:
        """torch.compile :func:`run_blocks`, all blocks as one graph.

        The blocks do no cache bookkeeping (``forward`` fetches the attention workspace before them
        and writes the new keys/values after them), so the graph has no breaks. Shapes are static by
        default: one graph per number of held frames (a handful while the cache fills, then the
        same one for every chunk), each specialised code rather than one dynamic-shape graph.
        """
        available_backends()  # probe them now: a first probe inside the graph would break it
        # the function, not a bound method: a deep copy of the model runs its own blocks
        self._compiled_blocks = torch.compile(run_blocks, mode=mode, dynamic=dynamic)

    def forward(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        *,
        text_context: TextContext | None = None,
        attention_pattern: AttentionPattern | None = None,
        kv_cache: KVCache | None = None,
        frame_offset: int = 0,
        update_cache: bool = False,
        rope_mode: RopePositionMode | str = RopePositionMode.ABSOLUTE,
        position_shift: int | None = None,
        sequence_parallel: SequenceParallel | None = None,
        return_dict: bool = True,
    ) -> Transformer2DModelOutput | tuple[torch.Tensor]:
        """Predict the flow (velocity) for ``hidden_states`` (B, C, F, H, W).

        Args:
            timestep: (B,) one timestep per sample, or (B, F) one per latent frame.
            encoder_hidden_states: (B, L, text_dim) prompt embedding; or pass ``text_context``.
            attention_pattern: self-attention restriction over the tokens of this call (with a cache,
                the queries are the last tokens: cached frames come first). None: full attention.
            kv_cache: cache of earlier frames; ``hidden_states`` then starts at latent frame
                ``frame_offset``. With ``update_cache`` its keys/values are written into the cache.
            rope_mode: temporal positions scheme, see :mod:`vidgen.models.rope`.
            position_shift: how far the frames after the cache's sinks are moved down in position,
                given explicitly (None: as ``rope_mode`` places them, :func:`rope_shift`); Rolling
                Forcing's calls place the sinks just before the newest frames they see this way.
            sequence_parallel: run the blocks on this process's shard of the tokens; every process of
                the group makes the same call and gets the whole output. ``kv_cache`` is then this
                process's shard of the cache (made by the sequence-parallel group).
        """
        call = self._prepare(
            hidden_states,
            timestep,
            encoder_hidden_states,
            text_context=text_context,
            attention_pattern=attention_pattern,
            kv_cache=kv_cache,
            frame_offset=frame_offset,
            update_cache=update_cache,
            rope_mode=rope_mode,
            position_shift=position_shift,
            sequence_parallel=sequence_parallel,
        )
        # 4. blocks
        x = call.x
        if torch.is_grad_enabled() and self.gradient_checkpointing:
            for layer, block in enumerate(self.blocks):
                x = self._gradient_checkpointing_func(block, x, call.modulation, call.text, call.ctx, layer)
        else:
            x = (self._compiled_blocks or run_blocks)(self.blocks, x, call.modulation, call.text, call.ctx)
        out = self._finish(call, x)
        if not return_dict:
            return (out,)
        return Transformer2DModelOutput(sample=out)

    def forward_many(self, calls: list[dict[str, Any]]) -> list[torch.Tensor]:
        """Several :meth:`forward` calls (their keyword arguments; ``hidden_states`` and
        ``timestep`` among them) as one: the tokens of every call go through the blocks together,
        each call attending to its own cache with its own positions and pattern, and writing its own
        cache. Returns each call's output, as :meth:`forward` returns it.

        The calls must agree on what is batched: the shape of ``hidden_states`` but its batch size,
        whether the timestep is per frame, and the text context's length (see :func:`batch_key`).
        Sequence parallelism and a gradient-checkpointed training step are not batched here.
        """
        if len(calls) == 1:
            return [self.forward(**calls[0], return_dict=False)[0]]
        prepared = [self._prepare(**call) for call in calls]
        if any(c.sequence_parallel is not None for c in prepared):
            raise ValueError("forward_many does not batch sequence-parallel calls")
        sizes = [c.batch for c in prepared]
        first = prepared[0]
        ctx = SelfAttentionContext(
            rope=first.ctx.rope,
            pattern=None,
            frame_tokens=first.ctx.frame_tokens,
            parallel=_EachCall([c.ctx for c in prepared], sizes),
        )
        x = torch.cat([c.x for c in prepared])
        modulation = torch.cat([c.modulation for c in prepared])
        text = TextContext.cat([c.text for c in prepared])
        x = run_blocks(self.blocks, x, modulation, text, ctx)
        return [self._finish(call, part) for call, part in zip(prepared, x.split(sizes))]

    def _prepare(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        *,
        text_context: TextContext | None = None,
        attention_pattern: AttentionPattern | None = None,
        kv_cache: KVCache | None = None,
        frame_offset: int = 0,
        update_cache: bool = False,
        rope_mode: RopePositionMode | str = RopePositionMode.ABSOLUTE,
        position_shift: int | None = None,
        sequence_parallel: SequenceParallel | None = None,
    ) -> _Call:
        """What :meth:`forward` does before the blocks: positions, the attention context, patch and
        time embeddings (steps 1-3)."""
        batch, _, num_frames, height, width = hidden_states.shape
        p_t, p_h, p_w = self.config.patch_size
        frames, grid_h, grid_w = num_frames // p_t, height // p_h, width // p_w
        frame_tokens = grid_h * grid_w
        if text_context is None:
            if encoder_hidden_states is None:
                raise ValueError("pass encoder_hidden_states or text_context")
            text_context = self.encode_text(encoder_hidden_states)
        cache_tokens = frame_tokens
        if sequence_parallel is not None:  # this process's shard of the cache: fewer tokens or fewer heads
            cache_tokens = sequence_parallel.cache_frame_tokens(frame_tokens)
        if kv_cache is not None and kv_cache.frame_tokens != cache_tokens:
            raise ValueError(
                f"the KV cache holds {kv_cache.frame_tokens} tokens per frame but the input needs {cache_tokens}"
            )

        # 1. positions: absolute latent frame indices, mapped by the rope position scheme
        rope_mode = RopePositionMode(rope_mode)
        device = hidden_states.device
        sinks = kv_cache.sink_frames if kv_cache is not None else 0
        window = kv_cache.window_frames if kv_cache is not None else 0
        shift = (
            rope_shift(frame_offset, rope_mode, sinks, window) if position_shift is None else position_shift
        )
        if frame_offset + frames - shift > self.config.rope_max_seq_len:
            raise ValueError(
                f"latent frame position {frame_offset + frames - 1 - shift} is beyond rope_max_seq_len="
                f"{self.config.rope_max_seq_len}; use rope_mode='rolling' with a sliding-window cache for long videos"
            )
        query_frames = torch.arange(frame_offset, frame_offset + frames, device=device)
        query_positions = frame_positions(query_frames, shift, sinks)
        cache_positions = (
            frame_positions(kv_cache.frame_index(device), shift, sinks) if kv_cache is not None else None
        )
        ctx = SelfAttentionContext(
            rope=self.rope(query_positions, grid_h, grid_w),
            pattern=attention_pattern,
            kv_cache=kv_cache,
            frame_tokens=frame_tokens,
        )
        self._attention_extras(
            ctx, text_context, query_positions, cache_positions, frame_tokens, batch, sequence_parallel
        )
        if kv_cache is not None:
            assert cache_positions is not None  # set with the cache
            ctx.cache_rope = self.rope(cache_positions, grid_h, grid_w)
            ctx.write_frame = frame_offset if update_cache else None
            if sequence_parallel is None and kv_cache.use_workspace:
                ctx.cache_stamp = (shift, grid_h, grid_w)
                new_tokens = frames * frame_tokens
                dtype = self._attention_dtype(device)
                ctx.workspace = kv_cache.workspace(ctx.cache_rope, ctx.cache_stamp, new_tokens, dtype)
                # compiled, staged also when not writing: one graph per cache fill level, not two
                if update_cache or self._compiled_blocks is not None:
                    shape = (len(self.blocks), batch, new_tokens, *kv_cache.k.shape[3:])  # (L, B, S, H, D)
                    ctx.staged = (
                        torch.empty(shape, dtype=dtype, device=device),
                        torch.empty(shape, dtype=dtype, device=device),
                    )

        # 2. patchify: (B, C, F, H, W) -> (B, F * H' * W', D)
        x = self._embed_patches(hidden_states)  # (B, D, F, rows, columns)
        x = x.flatten(2).transpose(1, 2).contiguous()
        if sequence_parallel is not None:  # from here on, this process's tokens of every frame
            x = sequence_parallel.shard(x, frame_tokens)  # (B, F * frame_tokens / P, D)
            ctx.parallel = sequence_parallel
            ctx.frame_tokens = x.shape[1] // frames

        # 3. time embedding, per sample (B, ...) or per latent frame (B, F, ...)
        if timestep.ndim == 2 and timestep.shape[1] != frames:
            raise ValueError(f"per-frame timestep has {timestep.shape[1]} entries for {frames} latent frames")
        temb, modulation = self.condition_embedder.embed_time(timestep, x.dtype)
        if timestep.ndim == 2:
            temb = temb.unflatten(0, (batch, frames))  # (B, F, D)
            modulation = modulation.unflatten(0, (batch, frames))  # (B, F, 6, D)
        modulation = self._text_modulation(modulation, text_context)

        return _Call(
            x,
            temb,
            modulation,
            text_context,
            ctx,
            kv_cache,
            update_cache,
            frame_offset,
            batch,
            frames,
            grid_h,
            grid_w,
            frame_tokens,
            sequence_parallel,
        )

    def _finish(self, call: _Call, x: torch.Tensor) -> torch.Tensor:
        """What :meth:`forward` does after the blocks: the cache write, output norm, projection,
        unpatchify (step 5)."""
        kv_cache, ctx, frames = call.kv_cache, call.ctx, call.frames
        if kv_cache is not None and call.update_cache:
            if ctx.staged is not None:
                kv_cache.write(slice(None), ctx.staged[0], ctx.staged[1], call.frame_offset)
            kv_cache.commit(call.frame_offset, frames)

        # 5. output norm, projection, unpatchify
        temb = call.temb
        table = self.scale_shift_table if temb.ndim == 2 else self.scale_shift_table[:, None]
        out_shift, out_scale = (table + temb.unsqueeze(-2)).unbind(-2)
        x = _modulate(self.norm_out(x.float()), out_shift, out_scale, ctx.frame_tokens).type_as(x)
        x = self.proj_out(x)
        if call.sequence_parallel is not None:
            x = call.sequence_parallel.gather(x, call.frame_tokens)  # (B, F * H' * W', C * p_t * p_h * p_w)
        p_t, p_h, p_w = self.config.patch_size
        x = x.reshape(call.batch, frames, call.grid_h, call.grid_w, p_t, p_h, p_w, -1)
        return x.permute(0, 7, 1, 4, 2, 5, 3, 6).flatten(6, 7).flatten(4, 5).flatten(2, 3)
