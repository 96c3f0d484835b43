"""``vidgen bench pipeline`` at tiny sizes: options, figures, JSON, plot, the CPU refusal.

No speed is asserted: timings are noisy; the tests check what is measured and how it is reported."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from tests.tiny import save_tiny_pipeline
from vidgen.bench import pipeline as benchmark
from vidgen.bench import pipeline_preset as benchmark_preset
from vidgen.bench import skyreels as benchmark_skyreels
from vidgen.cli import bench

PRESET = "wan2.1-t2v-1.3b-causal"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vidgen")
    bench.add_parser(parser.add_subparsers(dest="command"), "bench")
    return parser.parse_args(["bench", "pipeline", *argv])


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return str(save_tiny_pipeline(tmp_path_factory.mktemp("tiny") / "pipe"))


def test_cli_options_and_defaults():
    args = parse([])
    assert args.seconds is None and args.model is None and args.preset is None
    assert (args.compare_frames, args.compare_size, args.out_dir) == (257, 64, "outputs/bench")
    args = parse(["--preset", PRESET, "--random-weights", "--allow-cpu", "--attention-backend", "sdpa"])
    assert args.random_weights and args.allow_cpu and args.attention_backend == "sdpa"
    with pytest.raises(SystemExit):
        parse(["--attention-backend", "fastest"])


def test_benchmark_reports_every_figure(tiny_model, tmp_path, capsys):
    args = parse(
        ["--model", tiny_model, "--seconds", "7", "--compare-frames", "60", "--compare-size", "32",
         "--out-dir", str(tmp_path)]
    )  # fmt: skip
    assert benchmark.main(args) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "pipeline.json").read_text())
    assert (tmp_path / "pipeline.png").stat().st_size > 10_000

    names = [f["name"] for f in result["figures"]]
    for expected in (
        "chunk time, chunks 10-14 / 3-7",
        "peak memory growth, chunk 10 -> end",
        "model load time",
        "time to first frame",
        "real-time factor",
        "SkyReels-V2 DF, equal context / ours, wall time",
        "saved state, largest (after every chunk, as vidgen render)",
    ):
        assert any(name.startswith(expected) for name in names), expected
        assert expected in out
    for f in result["figures"]:
        assert isinstance(f["value"], float) and f["value"] == f["value"]  # a number, not NaN
        assert f["ok"] is None or f["target"]

    # 7 s at 16 fps in chunks of 2 latent frames (8 video frames, 5 for the first)
    rows = result["chunks"]
    assert [r["index"] for r in rows] == list(range(15))
    assert rows[-1]["video_end_s"] == pytest.approx(7.0)
    cost = result["constant_cost"]
    assert cost["early_chunks"] == [3, 4, 5, 6, 7] and cost["late_chunks"] == [10, 11, 12, 13, 14]
    # the late chunks are the long video's; the early ones were made again, between them
    assert cost["late_interleaved_s"] == [r["total_s"] for r in rows[10:15]]
    assert len(cost["early_interleaved_s"]) == 5
    median = sorted(cost["late_interleaved_s"])[2] / sorted(cost["early_interleaved_s"])[2]
    assert cost["ratio"] == pytest.approx(median)
    sequential = sorted(r["total_s"] for r in rows[10:15])[2] / sorted(r["total_s"] for r in rows[3:8])[2]
    assert cost["sequential_ratio"] == pytest.approx(sequential)
    assert cost["peak_rss_end_mib"] >= cost["peak_rss_base_mib"] > 0
    # the state was saved after every chunk (the size read at a chunk is the one before it)
    assert rows[0]["state_bytes"] == 0 and all(0 < r["state_bytes"] < 500_000 for r in rows[1:])
    assert result["state"]["kv_cache_bytes"] == 2 * 2 * 6 * 64 * 32 * 4  # K/V, layers, frames, tokens, width
    speed = result["speed"]
    assert speed["real_time_factor"] == pytest.approx(7.0 / rows[-1]["wall_s"])
    # where a chunk's time goes: every chunk recorded to H.264 as vidgen render does, the state
    # saving read off the time between chunks (nested intervals of one clock: never negative)
    assert all(r["encode_s"] > 0 and 0 < r["cache_s"] < r["total_s"] for r in rows)
    assert all(r["save_s"] > 0 for r in rows[:-1]) and "save_s" not in rows[-1]
    parts = result["chunk_breakdown_s"]
    assert list(parts) == [
        "transformer (denoising steps)",
        "cache write + drift",
        "decode",
        "H.264 encode",
        "state saving (and the loop)",
    ]
    assert parts["decode"] == pytest.approx(sorted(r["decode_s"] for r in rows[1:-1])[6])
    for name in parts:
        assert f"per chunk: {name}" in out
    assert 0 < speed["first_frame_s"] == rows[0]["wall_s"]

    # 60 frames round up to 18 latent frames: SkyReels makes one window of 12 (sink 3 + window 6
    # + chunk 3), then two more chunks of 3, each re-running the 9 before it; ours makes 6 chunks
    # of 3 (4 steps each) and writes each into the cache once: 24 + 6 calls
    sky = result["skyreels"]
    assert sky["num_frames"] == 69 and sky["same_network_max_abs_diff"] < 1e-4
    ours, theirs = sky["rows"]["ours (KV cache)"], sky["rows"]["SkyReels-V2 DF, equal context"]
    assert (ours["transformer_calls"], ours["latent_frames"], ours["frames"]) == (30, 90, 69)
    assert (theirs["transformer_calls"], theirs["latent_frames"]) == (12, 144)
    assert theirs["settings"] == {
        "base_num_frames": 45,
        "overlap_history": 33,
        "causal_block_size": 3,
        "ar_step": 0,
    }
    assert theirs["wall_ratio_vs_ours"] == pytest.approx(theirs["wall_s"] / ours["wall_s"])
    assert "recommended stride" not in " ".join(sky["rows"])  # 69 frames: shorter than its 97


def test_too_short_a_video_is_refused(tiny_model, tmp_path, capsys):
    args = parse(
        ["--model", tiny_model, "--seconds", "2", "--compare-frames", "0", "--out-dir", str(tmp_path)]
    )
    assert benchmark.main(args) == 2
    assert "at least 13" in capsys.readouterr().out
    assert not (tmp_path / "pipeline.json").exists()


def test_windows_and_ratios_of_a_long_video():
    assert benchmark.chunk_window(1201, 5) == [3, 4, 5, 6, 7]
    assert benchmark.chunk_window(1201, 500) == [498, 499, 500, 501, 502]
    assert benchmark.chunk_window(15, 500) == [10, 11, 12, 13, 14]
    rows = [
        {"index": i, "total_s": 3.0 if i >= 498 else 1.0, "peak_rss_mib": 100.0 + (i >= 10), "rss_mib": 90.0}
        for i in range(1201)
    ]
    long = {"chunks": rows, "early": [1.0, 1.0, 1.5, 2.0, 2.0], "late": [3.0, 3.0, 3.0, 2.0, 9.0]}
    cost = benchmark.constant_cost(long, [3, 4, 5, 6, 7], [498, 499, 500, 501, 502])
    assert cost["ratio"] == 2.0 and cost["sequential_ratio"] == 3.0
    assert cost["memory_base_chunk"] == 10 and cost["peak_growth"] == 0.0 and cost["rss_growth"] == 0.0


def test_memory_is_read():
    current, peak = benchmark.memory_mib()
    assert 0 < current <= peak


@pytest.mark.parametrize(
    ("requested", "expected"),
    [(257, 261), (261, 261), (60, 69), (1, 69), (70, 81)],
)
def test_skyreels_frames_fill_whole_windows(requested, expected):
    # base window 15 latent frames, then chunks of 3; 4 video frames per latent frame after the first
    assert benchmark_skyreels.aligned_frames(requested, base_latents=15, chunk=3, t=4) == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_preset_refuses_cpu(tmp_path, capsys):
    args = parse(["--preset", PRESET, "--random-weights", "--out-dir", str(tmp_path)])
    assert benchmark.main(args) == 2
    out = capsys.readouterr().out
    assert "needs a CUDA GPU" in out and "would take hours on CPU" in out and "--allow-cpu" in out
    assert not list(tmp_path.iterdir())


def test_preset_needs_weights(tmp_path, capsys):
    assert benchmark.main(parse(["--preset", PRESET, "--out-dir", str(tmp_path)])) == 2
    assert "--random-weights or --model" in capsys.readouterr().out


def test_random_wan_transformer_keeps_float32_modules():
    config = dict(benchmark_preset.WAN_1_3B, num_attention_heads=2, attention_head_dim=16, ffn_dim=32,
                  num_layers=2, text_dim=24, freq_dim=16)  # fmt: skip
    model = benchmark_preset.random_wan_transformer(torch.device("cpu"), torch.bfloat16, config=config)
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert dtypes["blocks.0.attn1.to_q.weight"] == torch.bfloat16
    assert dtypes["blocks.0.scale_shift_table"] == dtypes["blocks.1.norm2.weight"] == torch.float32
    assert dtypes["condition_embedder.time_embedder.linear_1.weight"] == torch.float32
    assert torch.all(model.blocks[0].attn1.norm_q.weight == 1) and torch.all(model.proj_out.bias == 0)
    assert 0.01 < float(model.blocks[0].ffn.net[2].weight.float().std()) < 0.03
    x = torch.randn(1, 16, 2, 8, 8, dtype=torch.bfloat16)  # the denoiser casts to the model's dtype
    with torch.no_grad():
        out = model(x, torch.tensor([500.0], dtype=torch.bfloat16), torch.randn(1, 5, 24)).sample
    assert out.shape == x.shape and torch.isfinite(out).all()


@pytest.mark.slow
def test_preset_on_cpu_with_allow_cpu(tmp_path):
    """The whole Wan-1.3B-sized path, one chunk at 128x128 (about a minute on two cores)."""
    args = parse(["--preset", PRESET, "--random-weights", "--allow-cpu", "--out-dir", str(tmp_path)])
    assert benchmark.main(args) == 0
    result = json.loads((tmp_path / f"pipeline-{PRESET}.json").read_text())
    c = result["config"]
    assert not c["meaningful"] and (c["height"], c["width"], c["num_frames"]) == (128, 128, 9)
    assert len(result["chunks"]) == 1 and result["chunks"][0]["frames"] == 9
    timed = [f for f in result["figures"] if f["unit"] in ("fps", "s", "GiB")]
    assert len(timed) == 5 and all("NOT meaningful" in f["note"] for f in timed)
    assert (tmp_path / f"pipeline-{PRESET}.png").exists()
    # the state sizes are the preset's (832x480), measured and computed whatever the device
    assert result["state"]["kv_cache_bytes"] == 2_587_852_800  # 3 sink + 6 window frames
    assert result["state"]["run_state_bytes"] < 30e6


def test_preset_state_sizes_at_a_small_size():
    """The state a Wan-preset video saves, measured by the pipeline's own save (here at 64x64)."""
    from diffusers import AutoencoderKLWan

    from vidgen.config import load_config

    config = load_config(PRESET).replace(**{"generation.height": 64, "generation.width": 64})
    with torch.device("meta"):
        vae = AutoencoderKLWan()
    sizes = benchmark_preset.preset_state_sizes(config, vae)
    frame = 16 * 8 * 8 * 4  # one latent frame, float32
    # the window context pass: every chunk made so far (replayed on resume, no KV snapshot); the
    # drift monitor's 16 chunks of 3 frames and its last frame
    tensors = 17 * 3 * frame + 16 * 3 * frame + frame
    assert sizes["chunks"] == 17
    assert tensors < sizes["run_state_bytes"] < tensors + 20_000  # + the anchor, counters, header
    assert sizes["kv_cache_bytes"] == 2 * 30 * 9 * 16 * 1536 * 2  # 3 + 6 frames, 16 tokens each, bf16
    assert sizes["decoder_state_bytes"] > 0
