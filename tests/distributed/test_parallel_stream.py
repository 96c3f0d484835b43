"""A whole video through ``sequence_parallel_stream`` on 2 CPU processes equals ``pipe.stream``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from tests.distributed.launch import run_ranks
from tests.models.conftest import relative_error
from tests.tiny import FP32, assert_frames_match, save_tiny_pipeline
from vidgen.pipelines import LongVideoPipeline, StreamControl

# a prompt change half-way (re-cache under the new prompt), guidance (batch 2 in the cache), and
# 12 latent frames through a cache of 2 sinks + a 4-frame window (it wraps twice)
REQUEST = dict(
    storyboard=[(0.0, "a red circle moving left"), (1.5, "a blue square moving up")],
    seconds=3,
    guidance_scale=3.0,
    generator=7,
    return_latents=True,
)


def _worker(rank: int, world: int, init_method: str, folder: Path) -> None:
    from vidgen.distributed import init_process_group, sequence_parallel_stream

    pipe = LongVideoPipeline.from_pretrained(folder / "pipe")
    ulysses = init_process_group(rank, world, init_method, kind="ulysses")
    results = {}
    for group in (ulysses, replace(ulysses, kind="ring")):
        chunks = list(sequence_parallel_stream(pipe, group, **REQUEST))
        results[group.kind] = np.concatenate([c.frames for c in chunks])
        results[f"{group.kind}_latents"] = torch.cat([c.latents for c in chunks], dim=2)

    # stopping on rank 0 stops every rank: only rank 0's control is read
    control = StreamControl()
    made = 0
    for _ in sequence_parallel_stream(
        pipe, ulysses, prompt="a circle", seconds=3, generator=1, control=control
    ):
        made += 1
        if made == 2 and rank == 0:
            control.stop()
    results["stopped_after"] = made
    torch.save(results, folder / f"rank{rank}.pt")


def test_sequence_parallel_video_equals_single_process(tmp_path):
    """Ulysses runs the very same per-head attention over the whole sequence on each rank, and
    everything else per token: on the development machine its frames equal one process's bit for
    bit, but the ranks' matmuls have other shapes and one thread, which some CPUs' BLAS kernels block
    (and so round) differently. Ring attention merges per-block partial softmaxes in its own float32
    arithmetic (~1e-7 relative from SDPA). Either way the latents agree to 1e-5 and a value on a
    uint8 rounding boundary may land one step off (6 of 589,824 values for ring here). In fp32: bf16
    autocast would round the single-process matmuls where ring attention keeps fp32."""
    save_tiny_pipeline(tmp_path / "pipe", **FP32)
    run_ranks(_worker, 2, tmp_path)
    pipe = LongVideoPipeline.from_pretrained(tmp_path / "pipe")
    chunks = list(pipe.stream(**REQUEST))
    expected = np.concatenate([c.frames for c in chunks])
    expected_latents = torch.cat([c.latents for c in chunks], dim=2)
    assert expected.shape == (48, 64, 64, 3)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        for kind in ("ulysses", "ring"):
            assert relative_error(got[f"{kind}_latents"], expected_latents) <= 1e-5, (kind, rank)
            assert_frames_match(got[kind], expected, fraction=1e-4)
        assert got["stopped_after"] == 2
