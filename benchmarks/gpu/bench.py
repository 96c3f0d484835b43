"""The device benchmark behind ``benchmarks/gpu/run.sh``: Wan-1.3B geometry on one GPU, random weights.

A Wan-1.3B-sized ``CausalWanTransformer`` (dim 1536, 12 heads of 128, 30 layers, FFN 8960) and a
real-size ``AutoencoderKLWan``, both random bfloat16 (nothing is downloaded), a random 512x4096
prompt embedding, 832x480, 4 sampler steps, the preset's chunking (3 latent frames per chunk,
3 sinks + 6 window frames). Every variant streams a 20-second video through
``LongVideoPipeline.stream(decode=False)`` with the VAE decode of chunk k overlapped with the
denoising of chunk k+1 on a second CUDA stream (:class:`OverlappedDecoder`):

* ``dense``   -- dense chunk-vs-cache attention, sdpa (cuDNN / flash kernels inside torch);
* ``flash``   -- dense, flash-attn 2 (skipped with the reason when flash-attn is not installed);
* ``radial``  -- ``generation.attention = "radial"`` (about 38 % of the keys), compiled FlexAttention;
* ``compiled``-- dense sdpa, the transformer's blocks as one ``torch.compile`` graph (``--compile-mode``, default
  ``default``; ``max-autotune-no-cudagraphs`` tunes kernels but may not fit in the 8 minutes);
* ``fp8``     -- FP8 weights and activations through torchao (``runtime.quantize = "fp8"``), on GPUs
  of compute capability >= 8.9; skipped with the reason elsewhere.

Figures per variant: frames per second over the 20-s video (decode included, from the call to
the last frame), time to first frame, peak ``torch.cuda.max_memory_allocated``, per-chunk wall time.
The ``dense`` variant runs on to chunk 52 for the per-chunk time at chunk 5 vs chunk 50 (medians of
chunks 3-7 and 48-52). Writes ``gpu.json`` and ``gpu.png`` to ``--out`` (``$OUT``).

``--dry-run``: the same code on the CPU with a tiny geometry (2 layers, 64x64, a tiny VAE, short
videos, chunk 8 instead of 50, eager flex, no compile); its numbers mean nothing. CI runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from vidgen.attention import get_backend
from vidgen.bench.pipeline_preset import WAN_1_3B, WAN_TEXT_TOKENS, random_wan_transformer
from vidgen.bench.skyreels import PromptEmbeddings
from vidgen.config import load_config
from vidgen.models import CausalWanTransformer
from vidgen.pipelines import LongVideoPipeline
from vidgen.pipelines.overlap import OverlappedDecoder
from vidgen.pipelines.vae_stream import frames_of_latents

PRESET = "wan2.1-t2v-1.3b-causal"
PROMPT = "a red fox running through snow"
FPS_TARGET = 25.0
VARIANTS = ("dense", "flash", "radial", "compiled", "fp8")
TINY_TRANSFORMER = dict(WAN_1_3B, num_attention_heads=2, attention_head_dim=16, text_dim=32, ffn_dim=64,
                        num_layers=2)  # fmt: skip
TINY_VAE = dict(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1)


def _geometry(dry_run: bool) -> dict:
    if dry_run:
        return dict(height=64, width=64, seconds=2.0, late_chunk=8, text_tokens=8)
    return dict(height=480, width=832, seconds=20.0, late_chunk=50, text_tokens=WAN_TEXT_TOKENS)


def build_pipeline(dry_run: bool, device: torch.device) -> LongVideoPipeline:
    """Random-weight pipeline of the preset's geometry (tiny for the dry run); never downloads."""
    from diffusers import AutoencoderKLWan

    dtype = torch.float32 if dry_run else torch.bfloat16
    config = load_config(PRESET).replace(
        **{
            "runtime.device": device.type,
            "runtime.dtype": str(dtype).removeprefix("torch."),
            "model.path": "",
        }
    )
    geometry = _geometry(dry_run)
    torch.manual_seed(0)
    if dry_run:
        transformer = CausalWanTransformer(**TINY_TRANSFORMER).eval().requires_grad_(False)
        text_dim = TINY_TRANSFORMER["text_dim"]
    else:
        transformer = random_wan_transformer(device, dtype)
        text_dim = WAN_1_3B["text_dim"]
    with torch.device(device):
        vae = AutoencoderKLWan(**(TINY_VAE if dry_run else {})).eval().requires_grad_(False)
        embeddings = torch.randn(1, geometry["text_tokens"], text_dim, dtype=dtype)
    torch.nn.Module.to(vae, dtype)
    pipe = LongVideoPipeline(transformer, vae, PromptEmbeddings(embeddings), config)
    return pipe.to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stream_video(pipe: LongVideoPipeline, seconds: float, overrides: dict, device: torch.device) -> dict:
    """One video, decode overlapped; per-chunk wall times, time to first frame, FPS, peak memory."""
    g = pipe.config.generation
    geometry = (pipe.config.generation.height, pipe.config.generation.width)
    num_frames = round(seconds * g.fps)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    decoder = OverlappedDecoder(pipe.vae, device)
    frames_out, first_frame_s, chunk_s, chunk_frames = 0, None, [], []
    start = last = time.perf_counter()
    with torch.inference_mode():
        for chunk in pipe.stream(
            PROMPT, num_frames=num_frames, height=geometry[0], width=geometry[1], generator=0,
            overrides=overrides, decode=False,
        ):  # fmt: skip
            decoder.submit(chunk.latents, chunk.index * g.chunk_frames)
            # the first chunk is collected at once (time to first frame); later ones one chunk late
            for frames in decoder.finish() if chunk.index == 0 else decoder.ready():
                frames_out += len(frames)
                if first_frame_s is None:
                    first_frame_s = time.perf_counter() - start
            now = time.perf_counter()
            chunk_s.append(now - last)
            last = now
            latents = chunk.latents.shape[2]
            start_f, end_f = frames_of_latents(chunk.index * g.chunk_frames, latents, pipe.temporal_factor)
            chunk_frames.append(min(end_f, num_frames) - start_f)
        for frames in decoder.finish():
            frames_out += len(frames)
    _sync(device)
    total = time.perf_counter() - start
    frames_out = min(frames_out, num_frames)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {
        "frames": frames_out,
        "seconds": total,
        "fps": frames_out / total,
        "time_to_first_frame_s": first_frame_s,
        "chunk_s": chunk_s,
        "chunk_frames": chunk_frames,
        "peak_gib": peak,
        "overlapped_decode": decoder.overlapping,
    }


def _median(values: list[float], center: int) -> float | None:
    window = values[max(center - 2, 0) : center + 3]
    return statistics.median(window) if len(window) == 5 else None


def fp8_unavailable(device: torch.device) -> str | None:
    """Why the FP8 variant cannot run here, or None."""
    if device.type != "cuda":
        return "FP8 needs a CUDA GPU"
    if torch.cuda.get_device_capability(device) < (8, 9):
        return "FP8 matmuls need compute capability >= 8.9 (Ada, Hopper)"
    try:
        import torchao  # noqa: F401  (what runtime.quantize = "fp8" runs on)
    except ImportError:
        return "FP8 needs torchao: pip install 'vidgen[quantize]'"
    return None


def skip_reason(name: str, device: torch.device, dry_run: bool) -> str | None:
    if name == "flash":
        return get_backend("flash").unusable_reason()
    if name == "compiled" and dry_run:
        return "dry run: torch.compile is checked by the slow test tests/pipelines/test_pipeline.py"
    if name == "fp8":
        return fp8_unavailable(device)
    return None


def run_variant(pipe: LongVideoPipeline, name: str, args: argparse.Namespace, device: torch.device) -> dict:
    overrides = {"runtime.attention_backend": "sdpa"}
    if name == "flash":
        overrides = {"runtime.attention_backend": "flash"}
    elif name == "radial":
        overrides = {"generation.attention": "radial", "runtime.attention_backend": "flex"}
    elif name == "compiled":
        pipe.compile(args.compile_mode)  # in place: this variant runs after the eager ones
    elif name == "fp8":
        pipe.quantize("fp8", device=device)  # in place: this variant runs last
    geometry = _geometry(args.dry_run)
    seconds = geometry["seconds"]
    if name == "dense":  # run on past the late chunk for the per-chunk comparison
        chunk_seconds = 4 * pipe.config.generation.chunk_frames / pipe.config.generation.fps
        seconds = max(seconds, (geometry["late_chunk"] + 3) * chunk_seconds)
    result = stream_video(pipe, seconds, overrides, device)
    # FPS over the first 20 s of video (the dense run goes on): those chunks' frames / their time
    wanted, made, n = round(geometry["seconds"] * pipe.config.generation.fps), 0, 0
    while n < len(result["chunk_frames"]) and made < wanted:
        made += result["chunk_frames"][n]
        n += 1
    result["fps_video"] = made / sum(result["chunk_s"][:n])
    return result


def save_plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, lines) = plt.subplots(1, 2, figsize=(11, 4))
    ran = {k: v for k, v in report["variants"].items() if "fps_video" in v}
    bars.bar(list(ran), [v["fps_video"] for v in ran.values()], color="tab:blue")
    bars.axhline(FPS_TARGET, color="tab:red", linestyle="--", label=f"target {FPS_TARGET:g} FPS")
    bars.set_ylabel("frames per second (decode incl.)")
    bars.set_title(
        f"{report['config']['width']}x{report['config']['height']}, {report['config']['device_name']}"
    )
    bars.legend()
    for name, v in ran.items():
        lines.plot(range(len(v["chunk_s"])), v["chunk_s"], label=name)
    lines.set_xlabel("chunk")
    lines.set_ylabel("wall seconds per chunk")
    lines.grid(alpha=0.3)
    lines.legend()
    if report["config"]["dry_run"]:
        fig.suptitle("DRY RUN on CPU, tiny geometry: the numbers mean nothing")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny geometry on the CPU (CI)")
    parser.add_argument(
        "--out", default=os.environ.get("OUT", "outputs/gpu"), help="JSON + PNG folder ($OUT)"
    )
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    parser.add_argument(
        "--compile-mode",
        default="default",
        help="torch.compile mode of the compiled variant (autotuning may not fit 8 min)",
    )
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip variants once this is spent")
    args = parser.parse_args(argv)
    args.dry_run = args.dry_run or os.environ.get("VIDGEN_GPU_DRY_RUN", "") not in ("", "0")
    if args.dry_run:
        os.environ.setdefault("VIDGEN_FLEX_COMPILE", "0")  # eager flex: seconds, not minutes, on a CPU
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print(
            "benchmarks/gpu: no CUDA device; run with --dry-run (or VIDGEN_GPU_DRY_RUN=1) to check the code"
        )
        return 2
    else:
        device = torch.device("cuda")
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(names) - set(VARIANTS)
    if unknown:
        print(f"benchmarks/gpu: unknown variant {sorted(unknown)[0]!r}; choose from {', '.join(VARIANTS)}")
        return 2
    names.sort(key=lambda n: VARIANTS.index(n))  # compiled and fp8 change the model: last
    started = time.perf_counter()
    build_start = time.perf_counter()
    pipe = build_pipeline(args.dry_run, device)
    geometry = _geometry(args.dry_run)
    pipe.config = pipe.config.replace(
        **{"generation.height": geometry["height"], "generation.width": geometry["width"]}
    )
    report = {
        "config": {
            "dry_run": args.dry_run,
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else platform.machine(),
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "vidgen_from": str(Path(sys.modules["vidgen"].__file__ or "").parent),  # the install used
            "height": geometry["height"],
            "width": geometry["width"],
            "seconds": geometry["seconds"],
            "steps": pipe.config.generation.num_inference_steps,
            "dtype": str(pipe.transformer.dtype),
            "build_s": time.perf_counter() - build_start,
            "fps_target": FPS_TARGET,
        },
        "variants": {},
    }
    for name in names:
        reason = skip_reason(name, device, args.dry_run)
        if reason is None and time.perf_counter() - started > args.budget_s:
            reason = f"time budget of {args.budget_s:g} s spent"
        if reason is not None:
            report["variants"][name] = {"skipped": reason}
            print(f"{name:<9} skipped: {reason}", flush=True)
            continue
        try:
            result = run_variant(pipe, name, args, device)
        except Exception as err:  # one variant failing must not lose the others' figures
            report["variants"][name] = {"failed": f"{type(err).__name__}: {err}"}
            print(f"{name:<9} FAILED: {type(err).__name__}: {err}", flush=True)
            continue
        report["variants"][name] = result
        peak = f"{result['peak_gib']:.1f} GiB" if result["peak_gib"] is not None else "-"
        print(
            f"{name:<9} {result['fps_video']:7.2f} FPS (target {FPS_TARGET:g})  first frame "
            f"{result['time_to_first_frame_s']:.2f} s  peak {peak}",
            flush=True,
        )
    dense = report["variants"].get("dense", {})
    if "chunk_s" in dense:
        early, late = _median(dense["chunk_s"], 5), _median(dense["chunk_s"], geometry["late_chunk"])
        report["chunk_5_vs_late"] = {
            "late_chunk": geometry["late_chunk"],
            "chunk_5_s": early,
            "late_s": late,
            "late_over_5": late / early if early and late else None,
        }
        print(
            f"dense per-chunk time, chunk {geometry['late_chunk']} / chunk 5: {report['chunk_5_vs_late']['late_over_5']}"
        )
    report["config"]["total_s"] = time.perf_counter() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(report, indent=2))
    save_plot(report, out / "gpu.png")
    print(f"wrote {out / 'gpu.json'} and {out / 'gpu.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
