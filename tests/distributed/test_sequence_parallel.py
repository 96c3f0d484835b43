"""Sequence-parallel transformer on 2 CPU processes (gloo) against the single-process model.

The parent builds a tiny seeded model and the inputs and writes them to a file; the ranks run the
same calls sharded and write what they got; the parent compares with the single-process result
(fp32, relative error <= 1e-5), checks that every rank got the same whole output, that each rank's
KV cache holds exactly its shard of the single-process cache, and that the bytes a rank sent are
what ``communication_volume`` predicts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed.launch import run_ranks
from tests.models.conftest import TINY, relative_error
from vidgen.attention import AttentionPattern
from vidgen.distributed import communication_volume
from vidgen.models import CausalWanTransformer

TOL = 1e-5
WORLD = 2
CONFIG = {**TINY, "num_attention_heads": 4}  # 2 heads per rank under Ulysses: head order matters
GRID = (4, 8)  # latent (h, w) -> 2 x 4 = 8 tokens per frame, 4 per rank
FRAME_TOKENS = 8


def _model() -> CausalWanTransformer:
    torch.manual_seed(0)
    return CausalWanTransformer(**CONFIG).eval()


# ----------------------------------------------------------------------------- whole-sequence calls


def _forward_cases() -> list[dict]:
    g = torch.Generator().manual_seed(1)
    text = torch.randn(2, 7, CONFIG["text_dim"], generator=g)

    def latents(frames: int) -> torch.Tensor:
        return torch.randn(2, 4, frames, *GRID, generator=g)

    return [
        {"name": "full", "x": latents(3), "timestep": torch.tensor([10.0, 700.0]), "text": text},
        {
            "name": "block_causal, per-frame timesteps",
            "x": latents(4),
            "timestep": torch.rand(2, 4, generator=g) * 1000,
            "text": text,
            "pattern": AttentionPattern.block_causal(FRAME_TOKENS, chunk_frames=2),
        },
        {
            "name": "sliding window with a sink",
            "x": latents(6),
            "timestep": torch.rand(2, 6, generator=g) * 1000,
            "text": text,
            "pattern": AttentionPattern.sliding_window(
                FRAME_TOKENS, chunk_frames=1, window_frames=2, sink_frames=1
            ),
        },
        {
            "name": "radial",
            "x": latents(4),
            "timestep": torch.tensor([300.0, 30.0]),
            "text": text,
            "pattern": AttentionPattern.radial(
                (2, 4), range(4), chunk_frames=1, query_frames=4, dense_frames=0, band_rows=0, tile_rows=1
            ),
        },
    ]


def _run_forward(model, case, **kwargs) -> torch.Tensor:
    return model(
        case["x"], case["timestep"], case["text"], attention_pattern=case.get("pattern"), **kwargs
    ).sample


def _forward_worker(rank: int, world: int, init_method: str, folder: Path, kind: str) -> None:
    from vidgen.distributed import init_process_group

    group = init_process_group(rank, world, init_method, kind=kind)
    payload = torch.load(folder / "payload.pt", weights_only=False)
    model = CausalWanTransformer(**CONFIG).eval()
    model.load_state_dict(payload["state"])
    outputs, sent = [], []
    with torch.no_grad():
        for case in payload["cases"]:
            before = group.bytes_sent
            outputs.append(_run_forward(model, case, sequence_parallel=group))
            sent.append(group.bytes_sent - before)
    torch.save({"outputs": outputs, "sent": sent}, folder / f"rank{rank}.pt")


@pytest.mark.parametrize("kind", ["ulysses", "ring"])
def test_forward_matches_single_process(kind, tmp_path):
    model, cases = _model(), _forward_cases()
    torch.save({"state": model.state_dict(), "cases": cases}, tmp_path / "payload.pt")
    run_ranks(_forward_worker, WORLD, tmp_path, kind)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    with torch.no_grad():
        for i, case in enumerate(cases):
            expected = _run_forward(model, case)
            got = ranks[0]["outputs"][i]
            assert relative_error(got, expected) <= TOL, case["name"]
            assert torch.equal(ranks[1]["outputs"][i], got), "every rank gets the same whole output"
            frames = case["x"].shape[2]
            volume = communication_volume(model.config, FRAME_TOKENS, frames, 0, WORLD, kind, 4, batch_size=2)
            assert ranks[0]["sent"][i] == ranks[1]["sent"][i] == volume, case["name"]


# ----------------------------------------------------------------------------- chunks against a KV cache

SINKS, WINDOW, CHUNK = 1, 2, 1  # 8 chunks of 1 frame: the 2-slot ring wraps, frame 7 before 6


def _chunk_inputs():
    g = torch.Generator().manual_seed(2)
    frames = 10
    return {
        "x": torch.randn(2, 4, frames, *GRID, generator=g),
        "timesteps": torch.rand(2, frames, generator=g) * 1000,
        "text": torch.randn(2, 7, CONFIG["text_dim"], generator=g),
    }


def _generate(model, inputs, make_cache, sequence_parallel=None):
    """8 one-frame chunks (rolling RoPE), then 2 chunks in one call under a block-causal pattern,
    reading but not writing the cache (as diffusion forcing's look-ahead does)."""
    cache = make_cache(
        batch_size=2, latent_height=GRID[0], latent_width=GRID[1], sink_frames=SINKS, window_frames=WINDOW
    )
    context = model.encode_text(inputs["text"])
    x, timesteps = inputs["x"], inputs["timesteps"]
    outputs, held, sent = [], [], []
    calls = [(start, CHUNK, None, True) for start in range(8)]
    calls.append((8, 2, AttentionPattern.block_causal(FRAME_TOKENS, CHUNK), False))
    for start, frames, pattern, update in calls:
        held.append(cache.num_cached_frames)
        before = sequence_parallel.bytes_sent if sequence_parallel is not None else 0
        part = slice(start, start + frames)
        kwargs = {"sequence_parallel": sequence_parallel} if sequence_parallel is not None else {}
        out = model(
            x[:, :, part],
            timesteps[:, part],
            text_context=context,
            kv_cache=cache,
            frame_offset=start,
            update_cache=update,
            rope_mode="rolling",
            attention_pattern=pattern,
            **kwargs,
        ).sample
        outputs.append(out)
        sent.append(sequence_parallel.bytes_sent - before if sequence_parallel is not None else 0)
    return outputs, cache, held, sent


def _chunk_worker(rank: int, world: int, init_method: str, folder: Path, kind: str) -> None:
    from vidgen.distributed import init_process_group

    group = init_process_group(rank, world, init_method, kind=kind)
    payload = torch.load(folder / "payload.pt", weights_only=False)
    model = CausalWanTransformer(**CONFIG).eval()
    model.load_state_dict(payload["state"])

    def make_cache(**kwargs):
        return group.make_kv_cache(model, **kwargs)

    with torch.no_grad():
        outputs, cache, held, sent = _generate(model, payload["inputs"], make_cache, group)
    result = {
        "outputs": outputs,
        "k": cache.k,
        "v": cache.v,
        "slots": cache.slot_frames,
        "held": held,
        "sent": sent,
    }
    torch.save(result, folder / f"rank{rank}.pt")


def _cache_shard(buffer: torch.Tensor, kind: str, rank: int) -> torch.Tensor:
    """Rank ``rank``'s part of a single-process cache buffer (L, B, slots * T, H, D)."""
    if kind == "ulysses":  # its heads, every token
        heads = buffer.shape[3] // WORLD
        return buffer[:, :, :, rank * heads : (rank + 1) * heads]
    per_rank = FRAME_TOKENS // WORLD  # its slice of every frame, every head
    return buffer.unflatten(2, (-1, WORLD, per_rank))[:, :, :, rank].flatten(2, 3)


@pytest.mark.parametrize("kind", ["ulysses", "ring"])
def test_chunked_generation_with_cache_matches_single_process(kind, tmp_path):
    model, inputs = _model(), _chunk_inputs()
    torch.save({"state": model.state_dict(), "inputs": inputs}, tmp_path / "payload.pt")
    run_ranks(_chunk_worker, WORLD, tmp_path, kind)
    with torch.no_grad():
        expected, cache, held, _ = _generate(model, inputs, model.make_kv_cache)
    assert cache.slot_frames == [0, 7, 6]  # the ring wrapped: the view is not in frame order
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        for i, (out, ref) in enumerate(zip(got["outputs"], expected)):
            assert relative_error(out, ref) <= TOL, f"rank {rank}, call {i}"
        assert got["slots"] == cache.slot_frames and got["held"] == held
        for name in ("k", "v"):
            shard = _cache_shard(getattr(cache, name), kind, rank)
            assert got[name].shape == shard.shape
            assert relative_error(got[name], shard) <= TOL, f"rank {rank} cache {name}"
        frames = [CHUNK] * 8 + [2]
        volumes = [
            communication_volume(model.config, FRAME_TOKENS, f, h, WORLD, kind, 4, batch_size=2)
            for f, h in zip(frames, held)
        ]
        assert got["sent"] == volumes
