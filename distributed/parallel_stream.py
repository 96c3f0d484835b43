"""A ``LongVideoPipeline`` run by a sequence-parallel group: same arguments, same chunks.

Every rank of the group calls :func:`sequence_parallel_stream` with the same arguments. Each rank
builds the same noise (it comes from the seed), runs the transformer on its shard of the tokens
against its shard of the KV cache, and gets the whole prediction back; so every rank steps the
sampler, decodes and yields the same chunks in lockstep. Rank 0's are the ones to use; the other
ranks must iterate as far (their iteration is what runs their part).

The pipeline does not know: it is handed a :class:`SequenceParallelTransformer`, which passes
``sequence_parallel=group`` to the model and makes sharded caches.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from vidgen.distributed.sequence_parallel import SequenceParallelGroup, validate_degrees

if TYPE_CHECKING:
    from vidgen.models import CausalWanTransformer, KVCache
    from vidgen.pipelines import LongVideoPipeline, StreamControl, VideoChunk


class SequenceParallelTransformer(nn.Module):
    """A ``CausalWanTransformer`` that runs its blocks on this rank's shard of the tokens.

    Called like the model; ``make_kv_cache`` returns this rank's shard of the cache. Every other
    attribute (``config``, ``dtype``, ``encode_text``, ``frame_tokens``, ...) is the model's.
    """

    def __init__(self, model: CausalWanTransformer, group: SequenceParallelGroup) -> None:
        super().__init__()
        self.model = model
        self.group = group

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, sequence_parallel=self.group, **kwargs)

    def make_kv_cache(self, **kwargs: Any) -> KVCache:
        return self.group.make_kv_cache(self.model, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # parameters, buffers, submodules (self.model)
        except AttributeError:
            return getattr(self.model, name)


class _GroupControl:
    """Rank 0's ``StreamControl`` as every rank sees it.

    ``stream`` reads its control at the same points on every rank (before each chunk, after each
    yield); each read here is a broadcast from rank 0, so all ranks stop and change prompt together.
    """

    def __init__(self, group: SequenceParallelGroup, control: StreamControl | None) -> None:
        self._group = group
        self._control = control if group.rank == 0 else None

    @property
    def stopped(self) -> bool:
        return bool(self._group.broadcast_object(self._control is not None and self._control.stopped))

    def take_prompt(self) -> str | None:
        prompt = self._control.take_prompt() if self._control is not None else None
        return self._group.broadcast_object(prompt)


def sequence_parallel_stream(
    pipe: LongVideoPipeline, group: SequenceParallelGroup, **stream_kwargs: Any
) -> Iterator[VideoChunk]:
    """``pipe.stream(**stream_kwargs)`` with the transformer split across ``group``; every rank of
    the group calls it with the same arguments and yields the same chunks.

    Differences from a single process: rank 0's seed is used everywhere (so ``generator=None``
    works), ``control`` is read on rank 0 only, and ``state_path`` must name a different file for
    every rank (each saves its own copy of the latents its cache is rebuilt from); with ``resume=True`` every rank needs its
    own saved state, or none does.
    """
    from vidgen.pipelines.pipeline import seed_of

    transformer = pipe.transformer
    g = pipe.config.generation
    overrides = stream_kwargs.get("overrides") or {}
    height = stream_kwargs.get("height") or overrides.get("generation.height") or g.height
    width = stream_kwargs.get("width") or overrides.get("generation.width") or g.width
    latent_h, latent_w = pipe.latent_size(height, width)
    validate_degrees(
        transformer.config,
        group.size,
        1,
        group.size,
        transformer.frame_tokens(latent_h, latent_w),
        group.kind,
    )

    kwargs = dict(stream_kwargs)
    kwargs["generator"] = group.broadcast_object(seed_of(kwargs.get("generator")))
    kwargs["control"] = _GroupControl(group, kwargs.get("control"))
    state_path = kwargs.get("state_path")
    resuming = bool(kwargs.get("resume")) and state_path is not None and Path(state_path).is_file()
    everyone = group.all_gather_object(resuming)
    if len(set(everyone)) > 1:  # every rank raises, so none is left waiting in a collective
        missing = [rank for rank, flag in enumerate(everyone) if not flag]
        raise FileNotFoundError(
            f"resume=True but ranks {missing} of the group have no saved state (each rank saves its own "
            "state to its own state_path); give every rank its file, or none"
        )

    parallel_pipe = type(pipe)(
        SequenceParallelTransformer(transformer, group), pipe.vae, pipe.text_encoder, pipe.config
    )
    yield from parallel_pipe.stream(**kwargs)
