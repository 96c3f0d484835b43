"""``vidgen bench pipeline``: what a long video costs with ``LongVideoPipeline``.

The default run measures, in one process, on whatever machine it runs on:

1. **constant cost**: one long video (10 minutes by default) streamed chunk by chunk; the median
   chunk time around chunk 500 over the median around chunk 5 (chunks 498-502 and 3-7; target
   <= 1.1), and the growth of the process's peak resident memory (``VmHWM``) from chunk 10 to the
   end (target <= 5 %);
2. **speed**: model load time; time to first frame, from calling ``stream`` to holding the first
   chunk's frames (target <= 1 s); real-time factor, video seconds made per wall second over the
   whole long video, VAE decode included (target >= 2);
3. **vs SkyReels-V2**: the same long video made by diffusers' ``SkyReelsV2DiffusionForcingPipeline``
   on identical random Wan weights (see :mod:`vidgen.bench.skyreels`).

The model is ``--model``, else the embedded default model, else -- while that is not trained yet --
a random model of the same architecture (the one ``vidgen train`` builds), saved and loaded back so
that loading is timed the same way; the output says which.

``--preset wan2.1-t2v-1.3b-causal --random-weights`` measures instead the throughput of a
Wan-1.3B-sized model on a CUDA GPU (see :mod:`vidgen.bench.pipeline_preset`).

Every figure goes into one table (value, target, verdict), ``pipeline.json`` and ``pipeline.png``
(per-chunk time and memory over the video) under ``--out-dir``; the preset run writes
``pipeline-<preset>.json`` / ``.png``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

from vidgen.bench.skyreels import SPEEDUP_TARGET
from vidgen.config import ConfigError, load_config
from vidgen.models import CausalWanTransformer
from vidgen.pipelines.loading import ModelLoadError, default_model_dir, save_components
from vidgen.pipelines.pipeline import InputError, LongVideoPipeline, autocast_dtype

PROMPT = "a red circle moving left on a black background"
CONSTANT_COST_TARGET = 1.1
MEMORY_GROWTH_TARGET = 0.05
REAL_TIME_TARGET = 2.0
FIRST_FRAME_TARGET = 1.0
EARLY_CHUNK, LATE_CHUNK, SPREAD = 5, 500, 2  # medians over chunks 3-7 and 498-502
MEMORY_BASE_CHUNK = 10
MIN_CHUNKS = 13  # the early and late windows must not overlap
STATE_TARGET_MB = 0.5  # the resumable state on disk, for the default model


def kv_cache_bytes(pipe: LongVideoPipeline) -> int:
    """Bytes of the KV cache of one video at the config's size (what the saved state held before
    it was latents): keys and values, every layer, every guidance branch, sinks + window."""
    g = pipe.config.generation
    return cache_bytes(pipe.transformer, g, *pipe.latent_size(g.height, g.width), pipe.transformer.dtype)


def cache_bytes(
    transformer: CausalWanTransformer, g, latent_h: int, latent_w: int, dtype: torch.dtype
) -> int:
    m = transformer.config
    branches = 2 if g.guidance_scale != 1.0 else 1
    frames = g.sink_frames + g.window_frames
    tokens = transformer.frame_tokens(latent_h, latent_w)
    return (
        2
        * m.num_layers
        * branches
        * frames
        * tokens
        * m.num_attention_heads
        * m.attention_head_dim
        * dtype.itemsize
    )


def figure(name: str, value, unit: str, target: str = "", ok: bool | None = None, note: str = "") -> dict:
    return {"name": name, "value": value, "unit": unit, "target": target, "ok": ok, "note": note}


def memory_mib() -> tuple[float, float]:
    """(current, peak) resident memory of this process in MiB (``VmRSS`` / ``VmHWM`` on Linux)."""
    try:
        fields = {}
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = float(rest.split()[0]) / 1024  # kB
        return fields["VmRSS"], fields["VmHWM"]
    except (OSError, KeyError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak /= 2**20 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
        return peak, peak


# ----------------------------------------------------------------------------- the model


def random_default_pipeline(folder: Path, seed: int = 0) -> Path:
    """A random pipeline of the embedded default model's architecture, saved to ``folder``."""
    # the architecture vidgen trains the default model with, so the timings predict the real one
    from vidgen.models.autoencoder import AutoencoderKLLite
    from vidgen.models.text_encoders import MiniLMTextEncoder
    from vidgen.training.configs import AutoencoderTrainConfig, TransformerTrainConfig

    torch.manual_seed(seed)
    transformer = CausalWanTransformer(**TransformerTrainConfig().model).eval()
    autoencoder = AutoencoderTrainConfig()
    vae = AutoencoderKLLite(z_dim=autoencoder.z_dim, hidden_channels=autoencoder.hidden_channels).eval()
    # nothing of the text encoder is saved: not loading it here leaves its load to the timed load
    text_encoder = MiniLMTextEncoder.__new__(MiniLMTextEncoder)
    save_components(folder, transformer, vae, text_encoder, load_config("default"))
    return folder


def load_pipeline(args: argparse.Namespace, scratch: Path) -> tuple[LongVideoPipeline, float, str]:
    """The pipeline, its load time in seconds, and a line saying which model it is."""
    if args.model:
        folder, what = args.model, f"the model in {args.model}"
    elif not args.random_weights and (default_model_dir() / "model_index.json").is_file():
        folder, what = None, "the embedded default model"
    else:
        folder = random_default_pipeline(scratch / "random", args.seed)
        reason = "--random-weights" if args.random_weights else "the embedded default model is not there yet"
        what = f"a RANDOM model of the default model's architecture ({reason})"
    start = time.perf_counter()
    pipe = LongVideoPipeline.from_pretrained(folder)
    return pipe, time.perf_counter() - start, what


def apply_runtime_options(pipe: LongVideoPipeline, args: argparse.Namespace) -> None:
    if args.attention_backend:
        pipe.config = pipe.config.replace(**{"runtime.attention_backend": args.attention_backend})
    if args.compile and not pipe.config.runtime.compile:
        pipe.config = pipe.config.replace(**{"runtime.compile": True})
        pipe.compile()


# ----------------------------------------------------------------------------- parts 1 and 2


def chunk_window(num_chunks: int, center: int) -> list[int]:
    """Chunks ``center +- SPREAD``, or the last ``2 * SPREAD + 1`` when the video is shorter."""
    center = min(center, num_chunks - 1 - SPREAD)
    return list(range(center - SPREAD, center + SPREAD + 1))


def stream_long_video(
    pipe: LongVideoPipeline, seconds: float, seed: int, early: list[int], late: list[int], state_dir: Path
) -> dict:
    """Stream the video, keeping per-chunk times and memory (not the frames), saving the state
    after every chunk into ``state_dir`` as ``vidgen render`` does (its size is kept too).

    The early chunks are also timed interleaved with the late ones, so that both are timed under
    the same background load: a second stream of the same video (same prompt and seed: the same
    chunks) starts after the first chunk, pauses before ``early[0]``, and makes one early chunk
    after each of the chunks ``late[0] - 1 .. late[-2]``. Its state is held from the start (the
    memory baseline includes it) and its time is left out of the long video's wall time. (Its
    frames are not used: with diffusers' Wan VAE, whose decoder state lives in the module, the two
    streams would mix each other's frames, not their cost.)
    """
    fps = pipe.config.generation.fps
    rows, interleaved = [], {"early": [], "late": []}
    state = state_dir / "state.safetensors"
    reference = pipe.stream(
        PROMPT, seconds=seconds, generator=seed, state_path=state_dir / "reference.safetensors"
    )
    aside = 0.0  # seconds spent on the reference stream

    def reference_chunk() -> float:
        nonlocal aside
        started = time.perf_counter()
        chunk = next(reference)
        aside += time.perf_counter() - started
        return chunk.metrics.total_seconds

    from vidgen.video import SegmentedRecording  # PyAV: here only, so the GPU benchmark runs without it

    recording = SegmentedRecording(state_dir / "segments", pipe.config.generation.fps)
    start = time.perf_counter()
    with torch.inference_mode():
        for chunk in pipe.stream(PROMPT, seconds=seconds, generator=seed, state_path=state):
            now = time.perf_counter() - start - aside
            rss, peak = memory_mib()
            m = chunk.metrics
            encode_started = time.perf_counter()
            recording.append(chunk.index, chunk.frames)  # H.264, as vidgen render records chunks
            rows.append(
                {
                    "index": chunk.index,
                    "state_bytes": state.stat().st_size if state.is_file() else 0,  # after the chunk before
                    "video_end_s": (chunk.frame_start + len(chunk.frames)) / fps,
                    "wall_s": now,
                    "total_s": m.total_seconds,
                    "denoise_s": m.denoise_seconds,
                    "cache_s": m.cache_seconds,
                    "decode_s": m.decode_seconds,
                    "encode_s": time.perf_counter() - encode_started,
                    "rss_mib": rss,
                    "peak_rss_mib": peak,
                }
            )
            if chunk.index in late:
                interleaved["late"].append(m.total_seconds)
            if chunk.index == 0:
                for _ in range(early[0]):
                    reference_chunk()
            elif late[0] - 1 <= chunk.index < late[-1]:
                interleaved["early"].append(reference_chunk())
                if len(interleaved["early"]) == len(early):
                    reference.close()
            if chunk.index % 100 == 0:
                print(f"  chunk {chunk.index}: {rows[-1]['video_end_s']:.0f} s of video", flush=True)
    for before, after in zip(rows, rows[1:]):
        # between two chunks: the first one's encoding and state saving, then the next chunk
        before["save_s"] = after["wall_s"] - before["wall_s"] - after["total_s"] - before["encode_s"]
    return {"first_frame_s": rows[0]["wall_s"], "wall_s": rows[-1]["wall_s"], "chunks": rows, **interleaved}


def chunk_breakdown(rows: list[dict]) -> dict[str, float]:
    """Median seconds per chunk of each stage of a chunk's path, as ``vidgen render`` runs it."""
    timed = [r for r in rows if "save_s" in r][1:]  # the first chunk compiles and warms up
    parts = {
        "transformer (denoising steps)": "denoise_s",
        "cache write + drift": "cache_s",
        "decode": "decode_s",
        "H.264 encode": "encode_s",
        "state saving (and the loop)": "save_s",
    }
    return {name: statistics.median(r[key] for r in timed) for name, key in parts.items()}


def constant_cost(long: dict, early: list[int], late: list[int]) -> dict:
    """The late / early chunk-time ratio (interleaved, and as the long video made them) and memory growth."""
    rows = long["chunks"]
    sequential_early = statistics.median(rows[i]["total_s"] for i in early)
    sequential_late = statistics.median(rows[i]["total_s"] for i in late)
    early_s, late_s = statistics.median(long["early"]), statistics.median(long["late"])
    base = rows[min(MEMORY_BASE_CHUNK, len(rows) - 1)]
    end = rows[-1]
    return {
        "early_chunks": early,
        "late_chunks": late,
        "early_median_s": early_s,
        "late_median_s": late_s,
        "ratio": late_s / early_s,
        "early_interleaved_s": long["early"],
        "late_interleaved_s": long["late"],
        "sequential_ratio": sequential_late / sequential_early,
        "memory_base_chunk": base["index"],
        "peak_rss_base_mib": base["peak_rss_mib"],
        "peak_rss_end_mib": end["peak_rss_mib"],
        "peak_growth": end["peak_rss_mib"] / base["peak_rss_mib"] - 1,
        "rss_base_mib": base["rss_mib"],
        "rss_end_mib": end["rss_mib"],
        "rss_growth": end["rss_mib"] / base["rss_mib"] - 1,
    }


def run_benchmark(args: argparse.Namespace) -> dict:
    """Parts 1-3 (see the module docstring); returns the JSON-able result."""
    seconds = 600.0 if args.seconds is None else args.seconds
    with tempfile.TemporaryDirectory(prefix="vidgen-bench-") as scratch:
        pipe, load_s, model = load_pipeline(args, Path(scratch))
    apply_runtime_options(pipe, args)
    g = pipe.config.generation
    chunks = len(pipe.plan(PROMPT, seconds=seconds).chunks)
    if chunks < MIN_CHUNKS:
        raise InputError(
            f"--seconds {seconds:g} makes {chunks} chunks; the constant-cost ratio needs at least "
            f"{MIN_CHUNKS} (--seconds {MIN_CHUNKS * g.chunk_frames * pipe.temporal_factor / g.fps:g})"
        )
    print(f"model: {model}\nstreaming {seconds:g} s of video ({chunks} chunks) ...", flush=True)
    early, late = chunk_window(chunks, EARLY_CHUNK), chunk_window(chunks, LATE_CHUNK)
    with tempfile.TemporaryDirectory(prefix="vidgen-bench-state-") as state_dir:
        long = stream_long_video(pipe, seconds, args.seed, early, late, Path(state_dir))
    cost = constant_cost(long, early, late)
    state_mb = max(r["state_bytes"] for r in long["chunks"]) / 1e6
    cache_mb = kv_cache_bytes(pipe) / 1e6
    real_time = seconds / long["wall_s"]
    breakdown = chunk_breakdown(long["chunks"])
    figures = [
        figure(
            f"chunk time, chunks {late[0]}-{late[-1]} / {early[0]}-{early[-1]} (medians, interleaved)",
            cost["ratio"], "x", f"<= {CONSTANT_COST_TARGET}", cost["ratio"] <= CONSTANT_COST_TARGET,
        ),
        figure(
            "  the same, as the long video made them (load drift included)", cost["sequential_ratio"], "x",
        ),
        figure(
            f"peak memory growth, chunk {cost['memory_base_chunk']} -> end ({seconds:g} s video)",
            100 * cost["peak_growth"], "%", f"<= {100 * MEMORY_GROWTH_TARGET:g} %",
            cost["peak_growth"] <= MEMORY_GROWTH_TARGET,
            f"VmHWM {cost['peak_rss_base_mib']:.0f} -> {cost['peak_rss_end_mib']:.0f} MiB",
        ),
        figure(
            "resident memory growth, same chunks", 100 * cost["rss_growth"], "%",
            note=f"VmRSS {cost['rss_base_mib']:.0f} -> {cost['rss_end_mib']:.0f} MiB",
        ),
        figure("model load time", load_s, "s"),
        figure(
            "time to first frame (stream() -> first chunk)", long["first_frame_s"], "s",
            f"<= {FIRST_FRAME_TARGET:g} s", long["first_frame_s"] <= FIRST_FRAME_TARGET,
        ),
        figure(
            "real-time factor (video s / wall s, decode and H.264 encode incl.)", real_time, "x",
            f">= {REAL_TIME_TARGET:g}", real_time >= REAL_TIME_TARGET,
        ),
        *(
            figure(f"  per chunk: {name}", seconds_, "s", note=f"{100 * seconds_ / sum(breakdown.values()):.0f} %")
            for name, seconds_ in breakdown.items()
        ),
        figure(
            "saved state, largest (after every chunk, as vidgen render)", state_mb, "MB",
            f"<= {STATE_TARGET_MB:g} MB", state_mb <= STATE_TARGET_MB,
            f"latents, not the {cache_mb:.2f} MB KV cache",
        ),
    ]  # fmt: skip
    result = {
        "config": machine_info() | {
            "model": model,
            "seconds": seconds,
            "fps": g.fps,
            "height": g.height,
            "width": g.width,
            "chunk_frames": g.chunk_frames,
            "sink_frames": g.sink_frames,
            "window_frames": g.window_frames,
            "num_inference_steps": g.num_inference_steps,
            "dtype": pipe.config.runtime.dtype,
            "autocast": str(autocast_dtype(pipe.config.runtime.autocast, pipe.device) or "off"),
            "compile": pipe.config.runtime.compile,
            "attention_backend": pipe.config.runtime.attention_backend or "auto",
            "device": str(pipe.device),
        },
        "constant_cost": cost,
        "speed": {"load_s": load_s, "first_frame_s": long["first_frame_s"], "real_time_factor": real_time},
        "chunk_breakdown_s": breakdown,
        "state": {"largest_bytes": max(r["state_bytes"] for r in long["chunks"]), "kv_cache_bytes": kv_cache_bytes(pipe)},
        "chunks": long["chunks"],
    }  # fmt: skip
    del pipe
    if args.compare_frames:
        from vidgen.bench import skyreels as benchmark_skyreels

        print(
            f"SkyReels-V2 comparison ({args.compare_frames}+ frames at {args.compare_size}px) ...", flush=True
        )
        comparison = benchmark_skyreels.compare(args.compare_frames, args.compare_size, args.seed)
        result["skyreels"] = comparison
        figures += _skyreels_figures(comparison)
    result["figures"] = figures
    return result


def _skyreels_figures(c: dict) -> list[dict]:
    size = f"{c['num_frames']} frames, {c['width']}x{c['height']}, {c['num_inference_steps']} steps, no CFG"
    figures = []
    for name, row in c["rows"].items():
        if not name.startswith("SkyReels"):
            continue
        primary = "equal context" in name
        figures.append(
            figure(
                f"{name} / ours, wall time",
                row["wall_ratio_vs_ours"],
                "x",
                f">= {SPEEDUP_TARGET:g}" if primary else "",
                row["wall_ratio_vs_ours"] >= SPEEDUP_TARGET if primary else None,
                f"{size}; transformer time {row['transformer_ratio_vs_ours']:.2f}x, "
                f"latent frames through it {row['latent_frames_ratio_vs_ours']:.2f}x",
            )
        )
    return figures


def machine_info() -> dict:
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


# ----------------------------------------------------------------------------- output


def format_table(result: dict) -> str:
    c = result["config"]
    width = max(len(f["name"]) for f in result["figures"])
    lines = [
        f"pipeline benchmark: {c['model']}",
        f"  on {c.get('gpu') or c['machine']}, torch {c['torch']}, {c['threads']} CPU threads",
        f"{'figure':<{width}}  {'value':>10}  {'target':<16} verdict",
    ]
    for f in result["figures"]:
        value = f"{f['value']:.2f} {f['unit']}"
        verdict = {True: "ok", False: "MISSED", None: "-"}[f["ok"]]
        lines.append(f"{f['name']:<{width}}  {value:>10}  {f['target'] or '-':<16} {verdict}")
        if f["note"]:
            lines.append(f"    {f['note']}")
    if "skyreels" in result:
        s = result["skyreels"]
        lines.append(
            "SkyReels-V2 comparison, one random network in both (max |difference| of a forward call "
            f"{s['same_network_max_abs_diff']:.1e}):"
        )
        for name, row in s["rows"].items():
            settings = row.get("settings")
            how = ", ".join(f"{k}={v}" for k, v in settings.items()) if settings else "KV cache"
            lines.append(
                f"  {name:<34} {row['wall_s']:7.1f} s wall, transformer {row['transformer_s']:6.1f} s in "
                f"{row['transformer_calls']} calls; {how}"
            )
    return "\n".join(lines)


def _rolling_median(values: list[float], half: int = 10) -> list[float]:
    return [statistics.median(values[max(0, i - half) : i + half + 1]) for i in range(len(values))]


def save_plot(result: dict, path: Path) -> None:
    """Per-chunk time and process memory over the video (and the SkyReels-V2 comparison, if run)."""
    from vidgen.plotting import pyplot

    plt = pyplot()

    rows = result["chunks"]
    comparison = result.get("skyreels")
    panels = 3 if comparison else 2
    fig, axes = plt.subplots(panels, 1, figsize=(8, 3.2 * panels))
    time_ax, mem_ax = axes[0], axes[1]
    video = [r["video_end_s"] for r in rows]
    for key, label, color in (("total_s", "chunk", "C0"), ("denoise_s", "of it denoising", "C2")):
        ms = [1000 * r[key] for r in rows]
        time_ax.plot(video, ms, ".", ms=2, alpha=0.4, color=color)
        time_ax.plot(video, _rolling_median(ms), "-", lw=1, color=color, label=f"{label} (rolling median)")
    if "constant_cost" in result:
        chunk_s = {r["index"]: r["video_end_s"] for r in rows}
        for key in ("early_chunks", "late_chunks"):
            first, last = result["constant_cost"][key][0], result["constant_cost"][key][-1]
            time_ax.axvspan(chunk_s.get(first - 1, 0.0), chunk_s[last], alpha=0.3, color="grey")
    time_ax.set_ylabel("ms per chunk")
    time_ax.set_ylim(bottom=0)
    time_ax.legend(loc="upper right", fontsize=8)
    time_ax.grid(True, alpha=0.3)
    mem_ax.plot(video, [r["rss_mib"] for r in rows], label="resident (VmRSS)")
    if "peak_rss_mib" in rows[0]:
        mem_ax.plot(video, [r["peak_rss_mib"] for r in rows], "--", label="peak (VmHWM)")
    mem_ax.set_ylim(bottom=0)
    mem_ax.set_xlabel("video time (s)")
    mem_ax.set_ylabel("process memory (MiB)")
    mem_ax.legend(loc="lower right", fontsize=8)
    mem_ax.grid(True, alpha=0.3)
    c = result["config"]
    where = c.get("gpu") or c["machine"]
    title = f"{c['model']}: {len(rows)} chunks on {where}; shaded: the compared chunks"
    fig.suptitle(textwrap.fill(title, 90), fontsize=9)
    if comparison:
        names = list(comparison["rows"])
        walls = [comparison["rows"][n]["wall_s"] for n in names]
        model_s = [comparison["rows"][n]["transformer_s"] for n in names]
        axes[2].barh(names, walls, color="C0", alpha=0.4, label="wall")
        axes[2].barh(names, model_s, color="C0", label="of it transformer")
        axes[2].invert_yaxis()
        axes[2].set_xlabel("seconds")
        axes[2].set_title(
            f"same long video: {comparison['num_frames']} frames, "
            f"{comparison['width']}x{comparison['height']}, {comparison['num_inference_steps']} steps, no CFG",
            fontsize=9,
        )
        axes[2].legend(loc="lower right", fontsize=8)
        axes[2].grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    """Run the benchmark, print the table, save JSON and PNG under ``args.out_dir``."""
    from vidgen.bench import pipeline_preset as benchmark_preset  # it builds on this module

    if args.preset and not args.random_weights and not args.model:
        print("vidgen bench pipeline: error: --preset needs --random-weights or --model FOLDER")
        return 2
    if args.preset and not torch.cuda.is_available() and not args.allow_cpu:
        print("vidgen bench pipeline: " + benchmark_preset.CPU_REFUSAL.format(preset=args.preset))
        return 2
    try:
        result = benchmark_preset.run_preset(args) if args.preset else run_benchmark(args)
    except (InputError, ConfigError, ModelLoadError) as err:  # a bad option: one line, like usage errors
        print(f"vidgen bench pipeline: error: {err}")
        return 2
    print(format_table(result))
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"pipeline-{args.preset}" if args.preset else "pipeline"
    json_path, png_path = out_dir / f"{stem}.json", out_dir / f"{stem}.png"
    json_path.write_text(json.dumps(result, indent=2))
    save_plot(result, png_path)
    print(f"table: {json_path}\nplot:  {png_path}")
    return 0
