"""Part 4 of ``vidgen bench pipeline``: a preset's model size on a CUDA GPU, with random weights.

``--preset wan2.1-t2v-1.3b-causal --random-weights`` builds a Wan-1.3B-sized transformer (dim 1536,
12 heads, 30 layers, FFN 8960, text_dim 4096) and a full-size ``AutoencoderKLWan`` with random
weights -- no text encoder: the prompt is a random 512x4096 embedding -- and streams a video at the
preset's 832x480 with its 4 sampler steps in bfloat16. It reports frames per second with the VAE
decode included (over the chunks after the cache has filled, and over the whole video), time to
first frame and peak GPU memory (``torch.cuda.max_memory_allocated``). ``--compile`` and
``--attention-backend`` apply. The anchors are Self Forcing's 17 FPS and LongLive's 20.7 FPS on one
H100; the target is 25 FPS on one H200. ``--model FOLDER`` runs real weights instead.

On CPU the run is refused (it would take hours) unless ``--allow-cpu``: then one chunk at 128x128
checks the code path, and the figures say they are not meaningful.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from vidgen.bench.pipeline import PROMPT, apply_runtime_options, figure, machine_info, memory_mib
from vidgen.bench.skyreels import PromptEmbeddings
from vidgen.config import load_config
from vidgen.models import CausalWanTransformer
from vidgen.pipelines.pipeline import InputError, LongVideoPipeline, autocast_dtype
from vidgen.pipelines.vae_stream import frames_of_latents

PRESET_FPS_TARGET = 25.0
FPS_ANCHORS = {"Self Forcing, 1x H100": 17.0, "LongLive, 1x H100": 20.7}
# Wan 2.1 T2V 1.3B, in diffusers' WanTransformer3DModel argument names
WAN_1_3B = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=12,
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=4096,
    freq_dim=256,
    ffn_dim=8960,
    num_layers=30,
    rope_max_seq_len=1024,
)
WAN_TEXT_TOKENS = 512
CPU_SIZE = 128
CPU_MAX_CHUNKS = 2
CPU_REFUSAL = (
    "--preset {preset} needs a CUDA GPU; the Wan-1.3B-sized run would take hours on CPU. Run it on a "
    f"CUDA machine, or add --allow-cpu to check the code path on one chunk at {CPU_SIZE}x{CPU_SIZE} "
    "(its numbers are not meaningful)"
)


def random_wan_transformer(
    device: torch.device, dtype: torch.dtype, seed: int = 0, config: dict = WAN_1_3B
) -> CausalWanTransformer:
    """A ``CausalWanTransformer`` of ``config`` (Wan-1.3B-sized) with random weights, made on the meta
    device and materialised parameter by parameter on ``device`` (no float32 copy of the whole model).
    The modules the model keeps in float32 stay float32, as ``from_pretrained(torch_dtype=...)`` does."""
    with torch.device("meta"):
        model = CausalWanTransformer(**config)
    keep = set(model._keep_in_fp32_modules)
    generator = torch.Generator(device=device).manual_seed(seed)
    for module_name, module in model.named_modules():
        for name, param in list(module.named_parameters(recurse=False)):
            path = f"{module_name}.{name}".split(".")
            value = torch.empty(
                param.shape, dtype=torch.float32 if keep & set(path) else dtype, device=device
            )
            if name == "bias":
                value.zero_()
            elif "norm" in path[-2]:
                value.fill_(1.0)
            else:
                value.normal_(0.0, 0.02, generator=generator)
            setattr(module, name, torch.nn.Parameter(value, requires_grad=False))
    return model.eval()


def preset_pipeline(args: argparse.Namespace, device: torch.device) -> tuple[LongVideoPipeline, float, str]:
    """The preset's pipeline in bfloat16 (VAE included, as the FPS anchors run it) and its build time."""
    config = load_config(args.preset).replace(
        **{"runtime.device": device.type, "runtime.dtype": "bfloat16", "model.path": ""}
    )
    dtype = torch.bfloat16
    start = time.perf_counter()
    if args.model:
        pipe = LongVideoPipeline.from_pretrained(args.model, config=config)
        what = f"{args.preset} weights from {args.model}"
    else:
        from diffusers import AutoencoderKLWan

        transformer = random_wan_transformer(device, dtype, args.seed)
        with torch.device(device):
            vae = AutoencoderKLWan().eval().requires_grad_(False)  # Wan 2.1's VAE config
            embeddings = torch.randn(1, WAN_TEXT_TOKENS, WAN_1_3B["text_dim"], dtype=dtype)
        pipe = LongVideoPipeline(transformer, vae, PromptEmbeddings(embeddings), config)
        what = "RANDOM Wan-1.3B-sized weights (no text encoder)"
    # nn.Module.to: diffusers' own warns about float32 modules, and the Wan VAE keeps none
    torch.nn.Module.to(pipe.vae, dtype)
    return pipe.to(device), time.perf_counter() - start, what


def run_preset(args: argparse.Namespace) -> dict:
    """Stream one video with the preset's model size; returns the JSON-able result."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_cpu = device.type == "cpu"
    pipe, build_s, model = preset_pipeline(args, device)
    apply_runtime_options(pipe, args)
    g = pipe.config.generation
    height = args.height or (CPU_SIZE if on_cpu else g.height)
    width = args.width or (CPU_SIZE if on_cpu else g.width)
    chunk_video_frames = frames_of_latents(0, g.chunk_frames, pipe.temporal_factor)[1]
    if args.seconds is not None:
        num_frames = round(args.seconds * g.fps)
    else:
        num_frames = chunk_video_frames if on_cpu else 20 * g.fps
    cpu_limit = frames_of_latents(0, CPU_MAX_CHUNKS * g.chunk_frames, pipe.temporal_factor)[1]
    if on_cpu and num_frames > cpu_limit:
        raise InputError(
            f"on CPU the Wan-1.3B-sized run makes at most {CPU_MAX_CHUNKS} chunks ({cpu_limit} frames); "
            f"--seconds asks for {num_frames} frames"
        )
    print(f"model: {model} on {device}, {width}x{height}, {num_frames} frames ...", flush=True)
    if not on_cpu:
        torch.cuda.reset_peak_memory_stats(device)
    rows = []
    scratch = tempfile.TemporaryDirectory(prefix="vidgen-bench-state-")
    state = Path(scratch.name) / "state.safetensors"  # saved after every chunk, as vidgen render does
    start = time.perf_counter()
    with torch.inference_mode(), scratch:
        for chunk in pipe.stream(
            PROMPT, num_frames=num_frames, height=height, width=width, generator=args.seed, state_path=state
        ):
            rows.append(
                {
                    "index": chunk.index,
                    "state_bytes": state.stat().st_size if state.is_file() else 0,  # after the chunk before
                    "frames": len(chunk.frames),
                    "wall_s": time.perf_counter() - start,
                    "total_s": chunk.metrics.total_seconds,
                    "denoise_s": chunk.metrics.denoise_seconds,
                    "decode_s": chunk.metrics.decode_seconds,
                    "rss_mib": memory_mib()[0],
                    "video_end_s": (chunk.frame_start + len(chunk.frames)) / g.fps,
                }
            )
    peak_gib = torch.cuda.max_memory_allocated(device) / 2**30 if not on_cpu else memory_mib()[1] / 1024
    # steady state: once the cache is full (sinks + window) the chunks cost the same
    warm = (g.sink_frames + g.window_frames) // g.chunk_frames + 1
    steady = rows[warm:] or rows
    fps_all = sum(r["frames"] for r in rows) / rows[-1]["wall_s"]
    steady_wall = sum(r["total_s"] for r in steady)
    fps_steady = sum(r["frames"] for r in steady) / steady_wall
    note = "CPU code-path check: NOT meaningful" if on_cpu else ""
    anchors = ", ".join(f"{k}: {v:g}" for k, v in FPS_ANCHORS.items())
    figures = [
        figure(
            f"FPS, chunks {steady[0]['index']}-{steady[-1]['index']} (decode incl.)", fps_steady, "fps",
            f">= {PRESET_FPS_TARGET:g} (H200)", None if on_cpu else fps_steady >= PRESET_FPS_TARGET,
            note or f"anchors {anchors}",
        ),
        figure("FPS, whole video incl. first chunk", fps_all, "fps", note=note),
        figure("time to first frame (stream() -> first chunk)", rows[0]["wall_s"], "s", note=note),
        figure(
            "peak memory" + (" (VmHWM)" if on_cpu else " (cuda max_memory_allocated)"), peak_gib, "GiB",
            note=note,
        ),
        figure("build time (random weights)" if not args.model else "load time", build_s, "s", note=note),
    ]  # fmt: skip
    sizes = preset_state_sizes(pipe.config, pipe.vae, args.seed, device)
    figures += [
        figure(
            f"saved state, {g.width}x{g.height}: latents, plan position, drift state", sizes["run_state_bytes"] / 1e6,
            "MB", note=f"measured after chunk {sizes['chunks'] - 1}, as a Ray worker saves it (no decoder)",
        ),
        figure(
            "  + Wan VAE streaming-decoder state (vidgen render)", sizes["decoder_state_bytes"] / 1e6, "MB",
            note="its causal-convolution caches, computed",
        ),
        figure(
            "  the KV cache the state held before (Wan-1.3B)", sizes["kv_cache_bytes"] / 1e6, "MB", note="computed",
        ),
    ]  # fmt: skip
    return {
        "config": machine_info() | {
            "preset": args.preset,
            "model": model,
            "device": str(device),
            "dtype": "bfloat16",
            "autocast": str(autocast_dtype(pipe.config.runtime.autocast, pipe.device) or "off"),
            "height": height,
            "width": width,
            "num_frames": num_frames,
            "num_inference_steps": g.num_inference_steps,
            "compile": bool(args.compile),
            "attention_backend": _attention_backend_name(pipe, args),
            "meaningful": not on_cpu,
        },
        "fps_anchors": FPS_ANCHORS,
        "state": sizes,
        "chunks": rows,
        "figures": figures,
    }  # fmt: skip


def preset_state_sizes(config, vae, seed: int = 0, device: torch.device | str = "cpu") -> dict:
    """Bytes of the resumable state of a video at the preset's size, in steady state.

    ``run_state_bytes`` is measured: the pipeline's own save, after every chunk of a video made at
    the preset's latent geometry (channels, size, chunk, sinks, window, steps) by a 2-layer random
    stand-in transformer with the preset's latent channels and patch -- the state holds latents, so
    the transformer's size does not enter it -- without decoding (as a Ray worker saves it), until
    the drift monitor's memory is full. ``decoder_state_bytes``: the Wan VAE's causal-convolution
    caches after a chunk, from a decode on the meta device (shapes only) in the VAE's dtype.
    ``kv_cache_bytes``: the Wan-1.3B transformer's KV cache in bfloat16, computed."""
    from vidgen.bench.pipeline import cache_bytes
    from vidgen.models.autoencoder import AutoencoderKLLite
    from vidgen.pipelines.drift import DriftMonitor
    from vidgen.pipelines.vae_stream import spatial_factor, streaming_decoder, temporal_factor

    g = config.generation
    s, t = spatial_factor(vae), temporal_factor(vae)
    latent_h, latent_w = g.height // s, g.width // s
    channels = WAN_1_3B["in_channels"]
    torch.manual_seed(seed)
    stand_in = CausalWanTransformer(
        **{
            **WAN_1_3B,
            "num_attention_heads": 2,
            "attention_head_dim": 16,
            "ffn_dim": 64,
            "num_layers": 2,
            "text_dim": 32,
        }
    ).eval()
    geometry = AutoencoderKLLite(
        z_dim=channels, hidden_channels=8, encoder_blocks=1, decoder_blocks=1, refine_channels=8,
        scale_factor_spatial=s, scale_factor_temporal=t,
    )  # fmt: skip
    text = PromptEmbeddings(torch.randn(1, 8, 32))
    device = torch.device(device)
    settings = {"runtime.device": device.type, "runtime.autocast": "off"}
    pipe = LongVideoPipeline(stand_in, geometry, text, config.replace(**settings)).to(device)
    chunks = DriftMonitor().history.maxlen + 1
    num_frames = frames_of_latents(0, chunks * g.chunk_frames, t)[1]
    with tempfile.TemporaryDirectory(prefix="vidgen-bench-state-") as scratch:
        state = Path(scratch) / "state.safetensors"
        for _ in pipe.stream(PROMPT, num_frames=num_frames, generator=seed, state_path=state, decode=False):
            pass
        run_state = state.stat().st_size

    decoder_state = 0
    if type(vae).__name__ == "AutoencoderKLWan":
        from diffusers import AutoencoderKLWan

        with torch.device("meta"):
            shadow = AutoencoderKLWan.from_config(vae.config)
        torch.nn.Module.to(shadow, next(vae.parameters()).dtype)
        decoder = streaming_decoder(shadow)
        decoder.mean, decoder.std = decoder.mean.to("meta"), decoder.std.to("meta")
        latents = torch.zeros(1, channels, g.chunk_frames, latent_h, latent_w, device="meta")
        decoder.decode(latents, 0)
        decoder.decode(latents, g.chunk_frames)
        decoder_state = sum(v.numel() * v.element_size() for v in decoder.state().values())
    with torch.device("meta"):
        wan = CausalWanTransformer(**WAN_1_3B)
    return {
        "chunks": chunks,
        "run_state_bytes": run_state,
        "decoder_state_bytes": decoder_state,
        "kv_cache_bytes": cache_bytes(wan, g, latent_h, latent_w, torch.bfloat16),
    }


def _attention_backend_name(pipe: LongVideoPipeline, args: argparse.Namespace) -> str:
    if args.attention_backend:
        return args.attention_backend
    from vidgen.attention.dispatch import select_backend

    c = pipe.transformer.config
    q = torch.zeros(
        1, 16, c.num_attention_heads, c.attention_head_dim, device=pipe.device, dtype=pipe.transformer.dtype
    )
    return f"auto ({select_backend(q, q, q).name})"
