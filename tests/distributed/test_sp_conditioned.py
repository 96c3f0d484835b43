"""The default model's additions (``ConditionedWanTransformer``: grid positions, text modulation,
text velocity) under sequence parallelism on 2 CPU processes equal one process: the shipped model
with ring attention (its 3 heads do not split over 2 ranks), and a tiny model with every addition
switched on and non-zero under both ring and Ulysses attention."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from tests.distributed.launch import run_ranks
from tests.models.conftest import relative_error
from tests.tiny import TINY_TRANSFORMER, assert_frames_match, tiny_components
from vidgen.models.extensions import ConditionedWanTransformer
from vidgen.pipelines import LongVideoPipeline

# a prompt change (the velocity read from the new prompt) and a cache that wraps
REQUEST = dict(
    storyboard=[(0.0, "a red circle moving left"), (1.0, "a fast blue square moving up")],
    seconds=2,
    generator=5,
    return_latents=True,
)


def _worker(
    rank: int, world: int, init_method: str, folder: Path, model: str, kinds: tuple[str, ...]
) -> None:
    from vidgen.distributed import init_process_group, sequence_parallel_stream

    pipe = LongVideoPipeline.from_pretrained(model or None)
    results = {}
    first = init_process_group(rank, world, init_method, kind=kinds[0])
    for kind in kinds:
        group = replace(first, kind=kind)
        chunks = list(sequence_parallel_stream(pipe, group, **REQUEST))
        results[kind] = np.concatenate([c.frames for c in chunks])
        results[f"{kind}_latents"] = torch.cat([c.latents for c in chunks], dim=2)
    torch.save(results, folder / f"rank{rank}.pt")


def _compare(folder: Path, model: str | None, kinds: tuple[str, ...]) -> None:
    pipe = LongVideoPipeline.from_pretrained(model)
    chunks = list(pipe.stream(**REQUEST))
    expected = np.concatenate([c.frames for c in chunks])
    expected_latents = torch.cat([c.latents for c in chunks], dim=2)
    for rank in range(2):
        got = torch.load(folder / f"rank{rank}.pt", weights_only=False)
        for kind in kinds:
            assert relative_error(got[f"{kind}_latents"], expected_latents) <= 1e-5, (kind, rank)
            assert_frames_match(got[kind], expected, fraction=1e-4)


def test_the_shipped_model_under_ring_attention_equals_one_process(tmp_path):
    """``vidgen render --parallel ray --sp 2`` on the default model ran into "text_velocity is not
    supported with sequence parallelism"; the ring ranks now rotate their own tokens' queries and
    keys (cached frames included) into the prompt's moving frame."""
    run_ranks(_worker, 2, tmp_path, "", ("ring",))
    _compare(tmp_path, None, ("ring",))


def test_every_addition_under_ring_and_ulysses_equals_one_process(tmp_path):
    """All three additions with random, non-zero weights (trained from zero, they would otherwise
    change nothing) on 2 heads, one per Ulysses rank: each rank must rotate its own heads by their
    own gains, and each ring rank its own tokens."""
    base = tiny_components(heads=2)
    torch.manual_seed(3)
    transformer = ConditionedWanTransformer(
        **{**TINY_TRANSFORMER, "num_attention_heads": 2},
        spatial_pos_grid=(4, 4),
        text_modulation=True,
        text_velocity=True,
    ).eval()
    with torch.no_grad():
        transformer.velocity_gain.normal_(0.0, 1.0)
        for module in (transformer.text_to_velocity.value, transformer.text_to_modulation):
            module.weight.normal_(0.0, 0.05)
        transformer.spatial_pos.normal_(0.0, 0.1)
    LongVideoPipeline(transformer, base.vae, base.text_encoder, base.config).save_pretrained(
        tmp_path / "pipe"
    )
    run_ranks(_worker, 2, tmp_path, str(tmp_path / "pipe"), ("ulysses", "ring"))
    _compare(tmp_path, str(tmp_path / "pipe"), ("ulysses", "ring"))
