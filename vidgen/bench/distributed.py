"""``vidgen bench distributed``: what sequence parallelism costs here, and what it would cost at scale.

Two parts:

1. **Measured** (CPU, local Ray): the same video made by one replica with ``sp = 1`` and with
   ``sp = 2`` (one thread per rank), per-chunk wall time after the first chunk, and the bytes each
   rank actually sent (``SequenceParallelGroup.bytes_sent``) next to what ``communication_volume``
   predicts. The model is ``--model``, else the embedded default model, else a small random one
   built here (the default model may not be trained yet). On CPU the collectives go through gloo
   on loopback, so the overhead is large; it is a check of the machinery, not a GPU forecast.
2. **Projected**: bytes per rank per chunk for a Wan-1.3B-sized transformer (dim 1536, 12 heads,
   30 layers, FFN 8960, 1560 tokens per latent frame at 832x480, chunks of 3 latent frames against
   12 cached frames, 4 sampler steps + 1 cache write, bf16, no CFG) on 2, 4 and 8 GPUs, the time to
   move them over NVLink and PCIe 4.0, and the speedup that leaves (no overlap of communication
   and compute assumed, so it is a lower bound). Ulysses needs the 12 heads divisible by ``sp``:
   at 8 GPUs only ring attention applies.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPT = "a red circle moving left on a black background"

# Wan 2.1 T2V 1.3B (diffusers WanTransformer3DModel config) at 832x480, the causal preset's chunking
WAN_1_3B = {
    "num_layers": 30,
    "num_attention_heads": 12,
    "attention_head_dim": 128,
    "ffn_dim": 8960,
    "in_channels": 16,
    "out_channels": 16,
    "patch_size": (1, 2, 2),
    "text_len": 512,
}
WAN_FRAME_TOKENS = 1560  # (480 / 8 / 2) * (832 / 8 / 2) = 30 * 52
WAN_CHUNK_FRAMES = 3
WAN_CACHE_FRAMES = 12  # window + sinks
WAN_FORWARD_CALLS = 5  # 4 distilled sampler steps + the context write
LINKS_GB_S = {"NVLink 4 (H100, per direction)": 450.0, "PCIe 4.0 x16 (per direction)": 32.0}
ASSUMED_TFLOPS = 400.0
"""Sustained bf16 throughput per GPU assumed for the compute side of the projection (H100-class,
about 40 % of the dense peak)."""


# ----------------------------------------------------------------------------- projection


def volume_per_rank(
    config: dict,
    frame_tokens: int,
    chunk_frames: int,
    cache_frames: int,
    sp: int,
    kind: str,
    dtype_bytes: int,
    forward_calls: int,
) -> tuple[int, str]:
    """Bytes one rank sends per chunk, and where the formula came from."""
    try:
        from vidgen.distributed.sequence_parallel import communication_volume
    except ImportError:
        communication_volume = None
    if communication_volume is not None:
        volume = communication_volume(
            config,
            frame_tokens,
            chunk_frames,
            cache_frames,
            sp,
            kind,
            dtype_bytes,
            forward_calls=forward_calls,
        )
        return volume, "vidgen.distributed.sequence_parallel.communication_volume"
    # Fallback (SP module absent): Ulysses issues 4 all-to-alls per attention layer (q, k, v in,
    # output back); each rank keeps 1/sp of every shard it holds.
    dim = config["num_attention_heads"] * config["attention_head_dim"]
    shard = chunk_frames * frame_tokens // sp * dim
    volume = forward_calls * config["num_layers"] * 4 * shard * (sp - 1) // sp * dtype_bytes
    return volume, "4 all-to-alls per layer (Ulysses), computed here"


def chunk_flops(
    config: dict, frame_tokens: int, chunk_frames: int, cache_frames: int, forward_calls: int
) -> float:
    """Matmul FLOPs of one chunk: per layer and token, q/k/v/o and cross-attention q/o projections
    (6 D^2), the FFN (2 D F), self-attention over cache + chunk and cross-attention over the text."""
    dim = config["num_attention_heads"] * config["attention_head_dim"]
    tokens = chunk_frames * frame_tokens
    keys = (cache_frames + chunk_frames) * frame_tokens
    per_token = (
        2 * (6 * dim * dim + 2 * dim * config["ffn_dim"]) + 4 * keys * dim + 4 * config["text_len"] * dim
    )
    return float(forward_calls * config["num_layers"] * tokens * per_token)


def projection() -> dict[str, Any]:
    flops = chunk_flops(WAN_1_3B, WAN_FRAME_TOKENS, WAN_CHUNK_FRAMES, WAN_CACHE_FRAMES, WAN_FORWARD_CALLS)
    compute_1 = flops / (ASSUMED_TFLOPS * 1e12)
    rows = []
    for gpus in (2, 4, 8):
        for kind in ("ulysses", "ring"):
            if kind == "ulysses" and WAN_1_3B["num_attention_heads"] % gpus:
                rows.append({"gpus": gpus, "kind": kind, "note": f"12 heads not divisible by {gpus}"})
                continue
            volume, source = volume_per_rank(
                WAN_1_3B,
                WAN_FRAME_TOKENS,
                WAN_CHUNK_FRAMES,
                WAN_CACHE_FRAMES,
                gpus,
                kind,
                2,
                WAN_FORWARD_CALLS,
            )
            row: dict[str, Any] = {"gpus": gpus, "kind": kind, "bytes_per_rank": volume, "source": source}
            for link, gb_s in LINKS_GB_S.items():
                comm = volume / (gb_s * 1e9)
                row[link] = {"comm_s": comm, "speedup": compute_1 / (compute_1 / gpus + comm)}
            rows.append(row)
    return {
        "model": "Wan-1.3B-sized: dim 1536, 12 heads, 30 layers, FFN 8960, bf16",
        "chunk": f"{WAN_CHUNK_FRAMES} latent frames x {WAN_FRAME_TOKENS} tokens against {WAN_CACHE_FRAMES} "
        f"cached frames, {WAN_FORWARD_CALLS} transformer calls",
        "chunk_tflop": flops / 1e12,
        "compute_1gpu_s": compute_1,
        "assumed_tflops": ASSUMED_TFLOPS,
        "links_gb_s": LINKS_GB_S,
        "rows": rows,
    }


# ----------------------------------------------------------------------------- measurement


def small_random_pipeline(folder: Path) -> Path:
    """A random pipeline small enough for a CPU benchmark (4 heads, 4 layers, 64x64 frames; the
    VAE has the embedded default model's size)."""
    import torch

    from vidgen.config import load_config
    from vidgen.models import CausalWanTransformer
    from vidgen.models.autoencoder import AutoencoderKLLite
    from vidgen.models.text_encoders import MiniLMTextEncoder
    from vidgen.pipelines import LongVideoPipeline

    torch.manual_seed(0)
    transformer = CausalWanTransformer(
        patch_size=(1, 2, 2),
        num_attention_heads=4,
        attention_head_dim=32,
        in_channels=4,
        out_channels=4,
        text_dim=384,
        freq_dim=64,
        ffn_dim=512,
        num_layers=4,
        rope_max_seq_len=64,
    ).eval()
    vae = AutoencoderKLLite(z_dim=4).eval()  # the embedded model's VAE size: decoding takes real time
    config = load_config("default").replace(**{"runtime.device": "cpu"})
    LongVideoPipeline(transformer, vae, MiniLMTextEncoder.load(), config).save_pretrained(folder)
    return folder


def _model_folder(model: str | None, scratch: Path) -> tuple[str, str]:
    if model:
        return model, model
    from vidgen.pipelines.loading import default_model_dir

    if (default_model_dir() / "model_index.json").is_file():
        return str(default_model_dir()), "the embedded default model"
    return str(small_random_pipeline(scratch / "small")), "a small random model (the default model is absent)"


def measure(
    model: str, sp: int, seconds: float, seed: int, scratch: Path, decode_worker: bool = False
) -> dict[str, Any]:
    """One video on one replica; per-chunk times are medians over the chunks after the first."""
    import ray

    from vidgen.distributed.ray_cluster import RayParallelism, is_loopback_cluster, place_workers
    from vidgen.distributed.ray_worker import PipelineSpec
    from vidgen.distributed.replica import Replica
    from vidgen.request import GenerationRequest

    layout = RayParallelism(sp=sp, replicas=1)
    placement = place_workers(layout, extra=int(decode_worker))
    work = scratch / f"sp{sp}{'-decoder' if decode_worker else ''}"
    replica = Replica(
        0,
        PipelineSpec(model=model),
        placement,
        sp,
        work,
        loopback=is_loopback_cluster(),
        decode_bundle=sp if decode_worker else None,
    )
    try:
        replica.start()
        request = GenerationRequest(prompt=PROMPT, seconds=seconds, seed=seed)
        chunks, arrivals = [], []
        start = time.perf_counter()
        for chunk in replica.stream(request, work, None, -1):
            arrivals.append(time.perf_counter() - start)
            chunks.append(chunk.metrics)
        traffic = ray.get([w.traffic.remote() for w in replica.workers])
    finally:
        replica.stop()
        placement.remove()
    steady = chunks[1:] or chunks
    # time spent making chunks 1.. if nothing overlapped, against the wall time they took
    made = sum(m.total_seconds + (m.decode_seconds if decode_worker else 0.0) for m in steady)
    wall = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else arrivals[-1]
    decode = sum(m.decode_seconds for m in steady)
    return {
        "sp": sp,
        "decode_worker": decode_worker,
        "chunks": len(chunks),
        "chunk_s": statistics.median(
            m.total_seconds + (m.decode_seconds if decode_worker else 0) for m in steady
        ),
        "denoise_s": statistics.median(m.denoise_seconds for m in steady),
        "decode_s": statistics.median(m.decode_seconds for m in steady),
        "period_s": wall / max(1, len(arrivals) - 1),
        "decode_hidden": max(0.0, min(1.0, (made - wall) / decode)) if decode_worker and decode > 0 else 0.0,
        "video_wall_s": arrivals[-1],
        "bytes_sent_per_rank": traffic,
    }


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    from vidgen.distributed.ray_cluster import connect

    started = connect(getattr(args, "address", None), num_cpus=max(2, args.sp))
    try:
        with tempfile.TemporaryDirectory(prefix="vidgen-bench-") as tmp:
            scratch = Path(tmp)
            model, described = _model_folder(args.model, scratch)
            runs = [measure(model, sp, args.seconds, args.seed, scratch) for sp in sorted({1, args.sp})]
            runs.append(measure(model, 1, args.seconds, args.seed, scratch, decode_worker=True))
            predicted = _predicted_bytes(model, args.sp)
    finally:
        if started == "local":
            import ray

            ray.shutdown()
    one, many, split = runs[0], runs[-2], runs[-1]
    return {
        "measured": {
            "model": described,
            "seconds": args.seconds,
            "runs": runs,
            "sp_overhead": many["chunk_s"] / one["chunk_s"],
            "decode_worker": {
                "period_inline_s": one["period_s"],
                "period_split_s": split["period_s"],
                "decode_hidden": split["decode_hidden"],
            },
            "predicted_bytes_per_rank_per_chunk": predicted,
        },
        "projected": projection(),
    }


def _predicted_bytes(model: str, sp: int) -> int | None:
    """``communication_volume`` for a steady chunk of the measured model (cache full)."""
    if sp == 1:
        return 0
    import torch

    from vidgen.pipelines import LongVideoPipeline

    pipe = LongVideoPipeline.from_pretrained(model)
    g = pipe.config.generation
    latent_h, latent_w = pipe.latent_size(g.height, g.width)
    config = pipe.transformer.config
    # what travels is in the dtype the blocks compute in: the autocast dtype when it is on
    try:
        from vidgen.pipelines.pipeline import autocast_dtype

        compute = autocast_dtype(pipe.config.runtime.autocast, pipe.device) or pipe.transformer.dtype
    except ImportError:
        compute = pipe.transformer.dtype
    volume, _ = volume_per_rank(
        {
            k: getattr(config, k)
            for k in (
                "num_layers",
                "num_attention_heads",
                "attention_head_dim",
                "out_channels",
                "in_channels",
                "patch_size",
            )
        },
        pipe.transformer.frame_tokens(latent_h, latent_w),
        g.chunk_frames,
        g.sink_frames + g.window_frames,
        sp,
        "ulysses",
        torch.finfo(compute).bits // 8,
        g.num_inference_steps + 1,
    )
    return volume


def format_measured(m: dict[str, Any]) -> str:
    lines = [
        f"Measured on CPU with local Ray ({m['model']}, {m['seconds']:g} s of video, 1 thread per worker):"
    ]
    lines.append(
        f"  {'run':<20} {'chunk s':>8} {'denoise s':>10} {'decode s':>9} {'period s':>9} {'bytes/rank/chunk':>17}"
    )
    for run in m["runs"]:
        sent = max(run["bytes_sent_per_rank"]) / max(1, run["chunks"])
        name = f"sp={run['sp']}" + (" + decode worker" if run["decode_worker"] else "")
        lines.append(
            f"  {name:<20} {run['chunk_s']:>8.4f} {run['denoise_s']:>10.4f} {run['decode_s']:>9.4f} "
            f"{run['period_s']:>9.4f} {sent:>17,.0f}"
        )
    sp = max(run["sp"] for run in m["runs"])
    d = m["decode_worker"]
    lines.append(
        f"  sp={sp} / sp=1 per-chunk time: {m['sp_overhead']:.2f}x; predicted bytes per rank for a steady "
        f"chunk: {m['predicted_bytes_per_rank_per_chunk']:,}"
    )
    lines.append(
        f"  decode worker: {d['decode_hidden']:.0%} of the decode time hidden behind denoising; a chunk every "
        f"{d['period_split_s']:.4f} s instead of {d['period_inline_s']:.4f} s"
    )
    return "\n".join(lines)


def format_projected(p: dict[str, Any]) -> str:
    lines = [f"Projected: {p['model']}; {p['chunk']}."]
    lines.append(
        f"  one chunk = {p['chunk_tflop']:.1f} TFLOP = {p['compute_1gpu_s'] * 1e3:.0f} ms on 1 GPU at an "
        f"assumed {p['assumed_tflops']:.0f} TFLOP/s; no compute/communication overlap assumed"
    )
    links = list(p["links_gb_s"])
    header = f"  {'GPUs':>4} {'kind':>8} {'MB/rank/chunk':>14}"
    for link in links:
        header += f" | {link.split(' (')[0] + ' ms':>14} {'speedup':>8}"
    lines.append(header)
    for row in p["rows"]:
        if "note" in row:
            lines.append(f"  {row['gpus']:>4} {row['kind']:>8}  n/a: {row['note']}")
            continue
        line = f"  {row['gpus']:>4} {row['kind']:>8} {row['bytes_per_rank'] / 1e6:>14.1f}"
        for link in links:
            line += f" | {row[link]['comm_s'] * 1e3:>14.2f} {row[link]['speedup']:>7.2f}x"
        lines.append(line)
    lines.append("  links: " + "; ".join(f"{k} {v:g} GB/s" for k, v in p["links_gb_s"].items()))
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Run the benchmark, print the report, save JSON and a PNG plot under ``args.out_dir``."""
    from vidgen.distributed.ray_cluster import DegreeError, RayParallelism

    try:
        RayParallelism(sp=args.sp)
        if args.seconds <= 0:
            raise DegreeError(f"--seconds must be positive, got {args.seconds}")
    except DegreeError as err:
        print(f"vidgen bench distributed: error: {err}", file=sys.stderr)
        return 2
    result = {"projected": projection()} if args.projection_only else run_benchmark(args)
    if "measured" in result:
        print(format_measured(result["measured"]) + "\n")
    print(format_projected(result["projected"]))
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / "distributed.json", out_dir / "distributed.png"
    json_path.write_text(json.dumps(result, indent=2))
    save_plot(result["projected"], png_path)
    print(f"table: {json_path}\nplot:  {png_path}")
    return 0


def save_plot(projected: dict[str, Any], path: Path) -> None:
    from vidgen.plotting import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    for link in projected["links_gb_s"]:
        for kind, style in (("ulysses", "-o"), ("ring", "--s")):
            rows = [r for r in projected["rows"] if r["kind"] == kind and "note" not in r]
            ax.plot(
                [1] + [r["gpus"] for r in rows],
                [1.0] + [r[link]["speedup"] for r in rows],
                style,
                label=f"{kind}, {link.split(' (')[0]}",
            )
    ax.plot([1, 8], [1, 8], ":", color="grey", label="ideal")
    ax.set_xlabel("GPUs (sp)")
    ax.set_ylabel("projected speedup per chunk")
    ax.set_title("Wan-1.3B-sized, 832x480: sequence parallelism")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
