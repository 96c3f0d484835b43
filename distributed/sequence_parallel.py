"""Sequence parallelism: several processes share one video's tokens, each running the transformer on
its shard; every collective they issue lives in :class:`SequenceParallelGroup`.

Layout. Every rank holds, of *every* latent frame, the same contiguous slice of ``frame_tokens / P``
tokens (rank ``r``: tokens ``r * T/P .. (r + 1) * T/P - 1`` of each frame, ``P`` ranks, ``T`` tokens
per frame). Sharding inside the frame rather than by whole frames means a chunk of any length (even
one frame) splits evenly, per-frame timestep modulation stays per frame, and causal patterns give
every rank the same amount of work.

Two kinds (:class:`ParallelConfig`):

* ``"ulysses"`` (DeepSpeed-Ulysses): an all-to-all turns the token shards into head shards, every
  rank attends over the whole sequence with ``H / P`` heads through ``dispatch_attention`` (so
  patterns and backends apply unchanged), and a second all-to-all turns the result back. The KV cache
  of a rank holds its heads for every token. Needs ``H`` divisible by ``P``.
* ``"ring"``: queries stay put, each rank's keys/values (its cache shard and its new tokens) travel
  around the ring of ranks, and the partial attentions are merged by log-sum-exp
  (:mod:`vidgen.distributed.ring`). The KV cache of a rank holds its tokens with every head. Works
  for any head count; sends more bytes (the cache travels).

The group implements the model's ``SequenceParallel`` hooks, so the model runs sharded with
``model(..., sequence_parallel=group, kv_cache=group.make_kv_cache(model, ...))``; pipelines use
:func:`vidgen.distributed.parallel_stream.sequence_parallel_stream`. Inference only: the
collectives have no backward.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

import torch
import torch.distributed as dist

from vidgen.distributed.ring import ring_attention
from vidgen.distributed.ulysses import ulysses_attention
from vidgen.models.kv_cache import KVCache

if TYPE_CHECKING:
    from vidgen.models import CausalWanTransformer
    from vidgen.models.transformer import SelfAttentionContext

SequenceParallelKind = Literal["ulysses", "ring"]
KINDS: tuple[str, ...] = get_args(SequenceParallelKind)


# ----------------------------------------------------------------------------- degrees


@dataclass(frozen=True)
class ParallelConfig:
    """How the processes of a job split the work: ``replicas`` groups of ``sp`` processes."""

    sp: int = 1
    """Sequence-parallel degree: processes that share one video's tokens."""
    kind: SequenceParallelKind = "ulysses"
    """'ulysses': all-to-all to head shards (needs num_attention_heads divisible by sp);
    'ring': keys/values passed around the ranks (any head count, more traffic)."""
    replicas: int = 1
    """Independent groups of ``sp`` processes, each making its own videos."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"ParallelConfig.kind={self.kind!r} is unknown; choose one of {', '.join(KINDS)}"
            )
        for name in ("sp", "replicas"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ParallelConfig.{name} must be an integer >= 1, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.sp * self.replicas


def _config_value(model_config: Any, name: str) -> Any:
    if isinstance(model_config, Mapping):
        return model_config[name]
    return getattr(model_config, name)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def validate_degrees(
    model_config: Any,
    sp: int,
    replicas: int,
    world_size: int,
    frame_tokens: int | None = None,
    kind: SequenceParallelKind = "ulysses",
) -> None:
    """Raise ``ValueError`` saying what to change when the degrees cannot run this model.

    ``model_config``: the transformer's config (``model.config`` or a dict); ``frame_tokens``: tokens
    per latent frame of the videos to make (``model.frame_tokens(latent_h, latent_w)``), if known.
    """
    config = ParallelConfig(sp=sp, kind=kind, replicas=replicas)  # checks kind and the signs
    if world_size != config.world_size:
        raise ValueError(
            f"world size {world_size} != sp {sp} x replicas {replicas} = {config.world_size}: launch "
            f"{config.world_size} processes, or choose sp and replicas whose product is {world_size}"
        )
    if kind == "ulysses":
        _check_heads(_config_value(model_config, "num_attention_heads"), sp)
    if frame_tokens is not None:
        _check_frame_tokens(frame_tokens, sp)


def resolve_kind(kind: str, heads: int, sp: int) -> SequenceParallelKind:
    """``runtime.sp_kind`` for a model with ``heads`` attention heads split over ``sp`` ranks:
    ``auto`` is Ulysses when the heads divide by sp (less traffic) and ring otherwise."""
    if kind == "auto":
        return "ulysses" if heads % sp == 0 else "ring"
    if kind not in KINDS:
        raise ValueError(f"sp_kind={kind!r} is unknown; choose auto or one of {', '.join(KINDS)}")
    return kind  # type: ignore[return-value]


def _check_heads(heads: int, sp: int) -> None:
    if heads % sp:
        raise ValueError(
            f"Ulysses sequence parallelism splits the {heads} attention heads across sp={sp} ranks, but "
            f"{heads} is not divisible by {sp}: use sp in ({_divisors(heads)}), or ring attention "
            "(--sp-kind ring or auto; runtime.sp_kind)"
        )


def _check_frame_tokens(frame_tokens: int, sp: int) -> None:
    if frame_tokens % sp:
        raise ValueError(
            f"each rank holds frame_tokens / sp tokens of every latent frame, but a latent frame has "
            f"{frame_tokens} tokens, not divisible by sp={sp}: use sp in ({_divisors(frame_tokens)}) "
            "or a height/width whose latent grid is"
        )


# ----------------------------------------------------------------------------- the group


class _PendingPass:
    """A ring pass in flight: ``wait()`` returns the tensor received from the previous rank."""

    def __init__(self, requests: list[Any], received: torch.Tensor) -> None:
        self._requests = requests
        self._received = received

    def wait(self) -> torch.Tensor:
        for request in self._requests:
            request.wait()
        return self._received


@dataclass(eq=False)
class SequenceParallelGroup:
    """This process's place in a sequence-parallel group, and the group's collectives.

    Implements the model's ``SequenceParallel`` hooks (shard, attention, gather, cache geometry).
    ``bytes_sent`` counts the tensor bytes this rank has put on the wire (what it keeps for itself
    excluded); :func:`communication_volume` predicts it.
    """

    group: Any
    """The torch.distributed process group of the ``size`` ranks."""
    rank: int
    """This process's rank inside the group (0 .. size - 1)."""
    size: int
    kind: SequenceParallelKind = "ulysses"
    ranks: tuple[int, ...] = ()
    """Global ranks of the group's members, in group order."""
    replica: int = 0
    """Which of the job's replicas this group is."""
    bytes_sent: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r} is unknown; choose one of {', '.join(KINDS)}")
        if not self.ranks:
            self.ranks = tuple(range(self.size))

    @classmethod
    def create(cls, config: ParallelConfig) -> SequenceParallelGroup:
        """Split the initialised world into ``config.replicas`` groups of ``config.sp`` consecutive
        ranks and return this process's. Every process must call it (group creation is collective)."""
        world = dist.get_world_size()
        if world != config.world_size:
            raise ValueError(
                f"world size {world} != sp {config.sp} x replicas {config.replicas} = {config.world_size}: "
                f"launch {config.world_size} processes, or choose sp and replicas whose product is {world}"
            )
        me = dist.get_rank()
        if config.replicas == 1:
            group = dist.group.WORLD
        else:
            group = None
            for replica in range(config.replicas):  # every rank creates every group, in the same order
                members = list(range(replica * config.sp, (replica + 1) * config.sp))
                made = dist.new_group(members)
                if me in members:
                    group = made
        first = me - me % config.sp
        return cls(
            group=group,
            rank=me % config.sp,
            size=config.sp,
            kind=config.kind,
            ranks=tuple(range(first, first + config.sp)),
            replica=me // config.sp,
        )

    def destroy(self) -> None:
        """Tear down torch.distributed in this process (all groups)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------------ collectives
    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        """Slice ``i`` of ``tensor`` (dim 0, of size ``size``) goes to rank ``i``; slice ``i`` of the
        result came from rank ``i``."""
        send = tensor.contiguous()
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=self.group)
        self.bytes_sent += _nbytes(send) * (self.size - 1) // self.size
        return received

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor``, in rank order."""
        send = tensor.contiguous()
        parts = [torch.empty_like(send) for _ in range(self.size)]
        dist.all_gather(parts, send, group=self.group)
        self.bytes_sent += _nbytes(send) * (self.size - 1)
        return parts

    def ring_pass(self, tensor: torch.Tensor) -> _PendingPass:
        """Start sending ``tensor`` to the next rank and receiving the previous rank's (same shape);
        compute while it travels, then ``wait()``."""
        send = tensor.contiguous()
        received = torch.empty_like(send)
        following = self.ranks[(self.rank + 1) % self.size]
        preceding = self.ranks[(self.rank - 1) % self.size]
        requests = dist.batch_isend_irecv(
            [
                dist.P2POp(dist.isend, send, following, group=self.group),
                dist.P2POp(dist.irecv, received, preceding, group=self.group),
            ]
        )
        self.bytes_sent += _nbytes(send)
        return _PendingPass(requests, received)

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (small Python values: seeds, control flags)."""
        holder = [obj]
        dist.broadcast_object_list(holder, src=self.ranks[0], group=self.group)
        return holder[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (a small Python value), in rank order."""
        gathered: list[Any] = [None] * self.size
        dist.all_gather_object(gathered, obj, group=self.group)
        return gathered

    # ------------------------------------------------------------------ the model's hooks
    def cache_frame_tokens(self, frame_tokens: int) -> int:
        """Tokens per latent frame in this rank's KV cache: all (Ulysses) or its slice (ring)."""
        _check_frame_tokens(frame_tokens, self.size)
        return frame_tokens if self.kind == "ulysses" else frame_tokens // self.size

    def cache_heads(self, heads: int) -> int:
        """Heads in this rank's KV cache: its share (Ulysses) or all (ring)."""
        if self.kind == "ulysses":
            _check_heads(heads, self.size)
            return heads // self.size
        return heads

    def shard(self, tokens: torch.Tensor, frame_tokens: int) -> torch.Tensor:
        """This rank's slice of every frame: (B, F * T, ...) -> (B, F * T / P, ...), frame-major."""
        _check_frame_tokens(frame_tokens, self.size)
        per_rank = frame_tokens // self.size
        return tokens.unflatten(1, (-1, self.size, per_rank))[:, :, self.rank].flatten(1, 2)

    def gather(self, tokens: torch.Tensor, frame_tokens: int) -> torch.Tensor:
        """Inverse of :meth:`shard`, on every rank: (B, F * T / P, ...) -> (B, F * T, ...)."""
        per_rank = frame_tokens // self.size
        parts = [part.unflatten(1, (-1, per_rank)) for part in self.all_gather(tokens)]  # (B, F, T/P, ...)
        return torch.stack(parts, dim=2).flatten(1, 3)  # (B, F, P, T/P, ...) -> (B, F * T, ...)

    def attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        ctx: SelfAttentionContext,
        layer: int,
    ) -> torch.Tensor:
        """Self-attention of this rank's un-rotated (B, S / P, H, D) shard; see the module docstring."""
        if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
            raise NotImplementedError(
                "sequence parallelism runs inference only (its collectives have no backward); "
                "call the model under torch.no_grad()"
            )
        heads = self.cache_heads(query.shape[2])  # also: can Ulysses split the heads?
        if ctx.kv_cache is not None and ctx.kv_cache.k.shape[3] != heads:
            raise ValueError(
                f"this rank's KV cache holds {ctx.kv_cache.k.shape[3]} heads but {self.kind} attention "
                f"over sp={self.size} ranks needs {heads}: make it with group.make_kv_cache(model, ...)"
            )
        if self.kind == "ulysses":
            return ulysses_attention(self, query, key, value, ctx, layer)
        return ring_attention(self, query, key, value, ctx, layer)

    def make_kv_cache(
        self,
        model: CausalWanTransformer,
        *,
        batch_size: int,
        latent_height: int,
        latent_width: int,
        sink_frames: int,
        window_frames: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> KVCache:
        """This rank's shard of the cache ``model.make_kv_cache`` would make (same arguments)."""
        return model.make_kv_cache(
            batch_size=batch_size,
            latent_height=latent_height,
            latent_width=latent_width,
            sink_frames=sink_frames,
            window_frames=window_frames,
            dtype=dtype,
            device=device,
            num_heads=self.cache_heads(model.config.num_attention_heads),
            frame_tokens=self.cache_frame_tokens(model.frame_tokens(latent_height, latent_width)),
        )


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def init_process_group(
    rank: int,
    world_size: int,
    init_method: str,
    backend: str | None = None,
    *,
    sp: int | None = None,
    kind: SequenceParallelKind = "ulysses",
) -> SequenceParallelGroup:
    """Join the job's torch.distributed world and return this process's sequence-parallel group.

    ``init_method``: a rendezvous every process can reach, e.g. ``file:///shared/tmp/rendezvous``.
    ``backend``: None picks nccl when CUDA is available (and makes ``cuda:<local rank>`` the current
    device) and gloo otherwise. ``sp``: ranks per group (None: all of them, one replica).
    """
    sp = world_size if sp is None else sp
    if world_size % sp:
        raise ValueError(
            f"world size {world_size} is not a whole number of sp={sp} groups: use sp in ({_divisors(world_size)})"
        )
    config = ParallelConfig(sp=sp, kind=kind, replicas=world_size // sp)
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    return SequenceParallelGroup.create(config)


# ----------------------------------------------------------------------------- traffic


def communication_volume(
    model_config: Any,
    frame_tokens: int,
    chunk_frames: int,
    cache_frames: int,
    sp: int,
    kind: SequenceParallelKind,
    dtype_bytes: int,
    *,
    batch_size: int = 1,
    forward_calls: int = 1,
) -> int:
    """Bytes one rank sends for a chunk: ``forward_calls`` transformer calls on ``chunk_frames`` latent
    frames of ``frame_tokens`` tokens, with ``cache_frames`` frames held in the KV cache.

    Counted from the collectives :class:`SequenceParallelGroup` issues (bytes a rank keeps for itself
    excluded). With ``P = sp``, ``T = frame_tokens``, ``F = chunk_frames``, ``C = cache_frames``,
    ``B = batch_size`` (2 with classifier-free guidance), ``L`` layers, hidden size
    ``D = heads * head_dim``, ``c = out_channels * prod(patch_size)``, ``b = dtype_bytes``, per call:

    * ulysses: ``L * 4 * B * F * T * D * b * (P - 1) / P**2`` -- per layer one all-to-all of the
      packed q/k/v shard (3 * B * F * T/P * D elements, of which (P - 1)/P leaves the rank) and one of
      the attention output (1 * ...). Independent of the cache: each rank's cache holds its heads.
    * ring: ``L * 2 * B * (C + F) * T * D * b * (P - 1) / P`` -- per layer P - 1 ring passes of the
      rank's keys and values, cache shard included (2 * B * (C + F) * T/P * D elements each).
    * both, once per call: all-gather of the output projection,
      ``(P - 1) * B * F * T / P * c * b``.

    A chunk of ``n`` sampler steps plus the context write is ``forward_calls = n + 1``. The object
    broadcasts of :func:`sequence_parallel_stream` (a few bytes per chunk) are not included.
    """
    validate_degrees(model_config, sp, 1, sp, frame_tokens, kind)
    layers = _config_value(model_config, "num_layers")
    heads = _config_value(model_config, "num_attention_heads")
    dim = heads * _config_value(model_config, "attention_head_dim")
    out_channels = _config_value(model_config, "out_channels") or _config_value(model_config, "in_channels")
    out_features = out_channels * math.prod(_config_value(model_config, "patch_size"))
    p, b, shard_tokens = sp, batch_size, frame_tokens // sp
    if kind == "ulysses":
        # q/k/v in, output back: 4 shards of (B, F * T/P, D), each rank keeping 1/P of each
        per_layer = 4 * b * chunk_frames * shard_tokens * (dim // p) * (p - 1)
    else:
        per_layer = 2 * b * (cache_frames + chunk_frames) * shard_tokens * dim * (p - 1)
    gather = (p - 1) * b * chunk_frames * shard_tokens * out_features
    return forward_calls * (layers * per_layer + gather) * dtype_bytes
