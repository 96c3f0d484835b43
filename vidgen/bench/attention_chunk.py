"""``vidgen bench attention --radial``: one chunk against a full KV cache, dense vs radial.

The geometry of one self-attention layer of a chunk (default: Wan-1.3B at 832x480 -- frames of
30x52 = 1560 tokens, a 3-frame chunk over 3 sink and 9 window frames, so 4680 queries over
23400 keys, 12 heads of 128). Keys are in the order the KV cache returns them (sinks, then the
window ring as its slots hold it, then the chunk), and the radial pattern is built from that
layout as generation builds it. Measured in one run:

* time per call of dense SDPA and of the radial pattern on each chosen backend (sdpa runs it
  tile by tile, flex with a compiled block mask), measured in rounds (every variant once per
  round), and the ratio dense / radial as the median of the rounds' ratios: the target is
  >= 2x at a density of <= 40 %;
* the radial output's relative error against dense, ``||radial - dense|| / ||dense||``, on
  random queries/keys/values (RMS-normalised and rotated by Wan's 3-D RoPE at their true
  positions, as the model feeds them): what the pattern drops, before any training.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from vidgen.attention.dispatch import dispatch_attention
from vidgen.attention.patterns import AttentionPattern

SPEEDUP_TARGET = 2.0
DENSITY_TARGET = 0.40


def cache_layout(sink_frames: int, window_frames: int, chunk_frames: int, chunks_done: int) -> list[int]:
    """Absolute frame of every key frame as the KV cache + chunk present them after ``chunks_done``
    chunks: sinks, the window in ring-slot order, then the chunk being made."""
    first = chunks_done * chunk_frames
    held = list(range(min(first, sink_frames))) + list(range(max(sink_frames, first - window_frames), first))
    slots: list[int] = [-1] * (sink_frames + window_frames)
    for f in held:
        slots[f if f < sink_frames else sink_frames + (f - sink_frames) % window_frames] = f
    return [f for f in slots if f >= 0] + list(range(first, first + chunk_frames))


def _inputs(args: argparse.Namespace, key_frames: list[int], device: torch.device):
    from vidgen.models.rope import RopePositionMode, WanRope, apply_rope, frame_positions, rope_shift

    h, w = args.frame_size
    heads, dim = args.heads or 12, args.head_dim or 128
    gen = torch.Generator().manual_seed(0)
    kv_len = len(key_frames) * h * w
    q_len = args.chunk_frames * h * w

    def rms(x: torch.Tensor) -> torch.Tensor:  # Wan's norm_q / norm_k (unit weight)
        return x * torch.rsqrt(x.pow(2).mean((-2, -1), keepdim=True) + 1e-6)

    k = rms(torch.randn(args.batch, kv_len, heads, dim, generator=gen))
    q = rms(torch.randn(args.batch, q_len, heads, dim, generator=gen))
    v = torch.randn(args.batch, kv_len, heads, dim, generator=gen)
    rope = WanRope(dim)
    first = key_frames[-args.chunk_frames]
    shift = rope_shift(first, RopePositionMode.ROLLING, args.sink_frames, args.window_frames)
    rotation = rope(frame_positions(torch.tensor(key_frames), shift, args.sink_frames), h, w)
    k = apply_rope(k, rotation)
    q = apply_rope(q, rotation[:, -q_len:])
    return (t.to(device) for t in (q, k, v))


def _once(call, device: torch.device) -> float:
    """Milliseconds of one call (synchronised on CUDA)."""
    start = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1000


def run_chunk_benchmark(args: argparse.Namespace, backends: list[str], device: torch.device) -> dict:
    """Dense vs radial for one chunk over a full cache; the JSON-able result."""
    h, w = args.frame_size
    chunks_done = (args.sink_frames + 2 * args.window_frames) // args.chunk_frames + 1  # ring wrapped
    key_frames = cache_layout(args.sink_frames, args.window_frames, args.chunk_frames, chunks_done)
    pattern = AttentionPattern.radial(
        (h, w), key_frames, chunk_frames=args.chunk_frames, sink_frames=args.sink_frames
    )
    q, k, v = _inputs(args, key_frames, device)
    q_len, kv_len = q.shape[1], k.shape[1]
    density = pattern.density(q_len, kv_len)
    calls = {"dense sdpa": lambda: dispatch_attention(q, k, v, backend="sdpa")}
    for name in backends:
        calls[f"radial {name}"] = lambda name=name: dispatch_attention(q, k, v, pattern=pattern, backend=name)
    rows = {variant: {"variant": variant, "backend": variant.split()[1], "ms_runs": []} for variant in calls}
    with torch.inference_mode():
        dense_out = calls["dense sdpa"]()
        for variant, call in calls.items():  # first calls: compiling, block masks, plans
            rows[variant]["first_ms"] = _once(call, device)
            if variant != "dense sdpa":
                out = call()
                rows[variant]["rel_error"] = (
                    (out - dense_out).float().norm() / dense_out.float().norm()
                ).item()
        # rounds of every variant in turn: a shared machine's load drifts over minutes, and each
        # round's ratios compare calls made seconds apart
        for round_ in range(max(args.repeats, 1)):
            for variant, call in calls.items():
                rows[variant]["ms_runs"].append(_once(call, device))
            times = ", ".join(f"{v} {r['ms_runs'][-1]:.0f} ms" for v, r in rows.items())
            print(f"  round {round_ + 1}: {times}", flush=True)
    dense_runs = rows["dense sdpa"]["ms_runs"]
    for row in rows.values():
        row["ms"] = statistics.median(row["ms_runs"])
        row["speedup_vs_dense"] = statistics.median(d / r for d, r in zip(dense_runs, row["ms_runs"]))
    rows = list(rows.values())
    best = max(rows[1:], key=lambda r: r["speedup_vs_dense"], default=None)
    return {
        "config": {
            "batch": args.batch,
            "heads": q.shape[2],
            "head_dim": q.shape[3],
            "frame_size": [h, w],
            "chunk_frames": args.chunk_frames,
            "sink_frames": args.sink_frames,
            "window_frames": args.window_frames,
            "key_frames": key_frames,
            "q_len": q_len,
            "kv_len": kv_len,
            "pattern": {
                "dense_frames": pattern.dense_frames,
                "band_rows": pattern.band_rows,
                "tile_rows": pattern.tile_rows,
            },
            "density": density,
            "dtype": "float32",
            "device": str(device),
            "repeats": args.repeats,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(),
        },
        "rows": rows,
        "ratios": {
            "density": density,
            "density_target": DENSITY_TARGET,
            "best_backend": best["backend"] if best else None,
            "dense_over_radial": best["speedup_vs_dense"] if best else None,
            "speedup_target": SPEEDUP_TARGET,
            "ok": bool(best) and best["speedup_vs_dense"] >= SPEEDUP_TARGET and density <= DENSITY_TARGET,
        },
    }


def format_chunk_table(result: dict) -> str:
    c, r = result["config"], result["ratios"]
    lines = [
        f"chunk vs cache: {c['q_len']} queries over {c['kv_len']} keys (frames {c['frame_size'][0]}x"
        f"{c['frame_size'][1]}, chunk {c['chunk_frames']}, sinks {c['sink_frames']}, window {c['window_frames']}), "
        f"B={c['batch']} H={c['heads']} D={c['head_dim']} {c['dtype']} on {c['device']} ({c['threads']} threads); "
        f"radial density {c['density']:.1%}; medians of {c['repeats']} rounds",
        f"{'variant':<14} {'ms/call':>10} {'vs dense':>9} {'rel. error':>11} {'first call ms':>14}",
    ]
    for row in result["rows"]:
        error = f"{row['rel_error']:.3f}" if "rel_error" in row else "-"
        lines.append(
            f"{row['variant']:<14} {row['ms']:>10.0f} {row['speedup_vs_dense']:>8.2f}x {error:>11} {row['first_ms']:>14.0f}"
        )
    if r["best_backend"]:
        verdict = "ok" if r["ok"] else "MISSED"
        lines.append(
            f"dense / radial ({r['best_backend']}) = {r['dense_over_radial']:.2f}x at density {r['density']:.1%} "
            f"(target >= {r['speedup_target']:g}x at <= {r['density_target']:.0%}: {verdict})"
        )
    return "\n".join(lines)
