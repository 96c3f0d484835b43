"""``vidgen bench quantize``: what int8 / fp8 weights cost and save, measured in one run.

1. Wan 2.1 1.3B geometry (dim 1536, 12 heads of 128, ffn 8960, text 4096), random weights, a
   reduced number of blocks (``--layers``) to fit CPU time: the transformer's weight memory (per
   block, and scaled to the 30 blocks of the real model) and its output error against float32 on
   the same random input, for bfloat16 weights (a reference point), int8 and fp8.
2. The embedded default model: ``vidgen eval`` figures (held-out prompts) with and without int8.

Errors are relative: ``||y - y_fp32|| / ||y_fp32||`` over the whole output (and the largest
absolute difference over the output's std). Numbers are of this machine; see ``method`` for how
each variant runs here (fp8 is emulated off fp8-capable GPUs).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from vidgen.bench.pipeline_preset import WAN_1_3B
from vidgen.models import CausalWanTransformer
from vidgen.models.quantization import QuantizationUnavailable, method, quantize_linears, weight_bytes

VARIANTS = ("float32", "bfloat16", "int8", "fp8")


def _random_wan(layers: int, seed: int) -> CausalWanTransformer:
    torch.manual_seed(seed)
    model = CausalWanTransformer(**{**WAN_1_3B, "num_layers": layers}).eval().requires_grad_(False)
    for name, param in model.named_parameters():  # Wan-like scales: default init is too small to matter
        if param.ndim == 2:
            torch.nn.init.normal_(param, std=param.shape[1] ** -0.5)
        elif "norm" not in name:
            torch.nn.init.normal_(param, std=0.02)
    return model


@torch.no_grad()
def wan_geometry(layers: int, frames: int, latent_side: int, seed: int, device: torch.device) -> dict:
    """Weight memory and output error of each variant on random Wan-1.3B-geometry weights."""
    reference = _random_wan(layers, seed).to(device)
    state = reference.state_dict()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(1, 16, frames, latent_side, latent_side, generator=g).to(device)
    text = torch.randn(1, 32, WAN_1_3B["text_dim"], generator=g).to(device)
    t = torch.tensor([500.0], device=device)

    def run(model) -> tuple[torch.Tensor, float]:
        dtype = model.dtype
        model(x.to(dtype), t, text.to(dtype))  # warm-up
        start = time.perf_counter()
        y = model(x.to(dtype), t, text.to(dtype)).sample.float()
        return y, time.perf_counter() - start

    y_ref, _ = run(reference)
    rows = {}
    for variant in VARIANTS:
        model = _random_wan(layers, seed).to(device)
        model.load_state_dict(state)
        how = variant
        if variant == "bfloat16":
            torch.nn.Module.to(model, torch.bfloat16)  # all of it: a plain cast, as a reference
        elif variant in ("int8", "fp8"):
            quantize_linears(model, variant, device=device)
            how = method(variant, device)
        y, seconds = run(model)
        blocks = weight_bytes(model.blocks)
        rest = weight_bytes(model) - blocks
        diff = (y - y_ref).float()
        rows[variant] = {
            "method": how,
            "block_MiB": blocks / layers / 2**20,
            "weights_30_blocks_GiB": (blocks / layers * WAN_1_3B["num_layers"] + rest) / 2**30,
            "relative_error": float(diff.norm() / y_ref.norm()),
            "max_error_over_std": float(diff.abs().max() / y_ref.std()),
            "forward_seconds": seconds,
        }
    return {
        "layers": layers,
        "tokens": frames * (latent_side // 2) ** 2,
        "device": str(device),
        "variants": rows,
    }


def default_model_eval(prompts: int, seconds: float, seed: int, out_dir: Path) -> dict:
    """``vidgen eval --held-out PROMPTS --seconds SECONDS`` on the default model, float32 and int8."""
    from vidgen import evaluation
    from vidgen.pipelines import LongVideoPipeline

    results = {}
    for variant in ("float32", "int8"):
        overrides = {"runtime.quantize": "int8"} if variant == "int8" else {}
        pipe = LongVideoPipeline.from_pretrained(None, **overrides)
        report = evaluation.evaluate_model(
            pipe,
            prompts=evaluation.held_out_prompts(prompts, seed),
            seconds=seconds,
            seed=seed,
            out_dir=out_dir / f"eval-{variant}",
            log=lambda line: print(line, flush=True),
        )
        results[variant] = {"transformer_MiB": weight_bytes(pipe.transformer) / 2**20, **report["short"]}
    return results


def format_table(result: dict) -> str:
    geo = result["wan_geometry"]
    lines = [
        f"Wan 2.1 1.3B geometry, {geo['layers']} random blocks, {geo['tokens']} tokens, on {geo['device']}",
        f"{'variant':10s} {'method':32s} {'MiB/block':>10s} {'GiB (30 blocks)':>16s} "
        f"{'rel. error':>11s} {'max err/std':>12s} {'forward s':>10s}",
    ]
    for name, row in geo["variants"].items():
        lines.append(
            f"{name:10s} {row['method']:32s} {row['block_MiB']:10.1f} {row['weights_30_blocks_GiB']:16.3f} "
            f"{row['relative_error']:11.2e} {row['max_error_over_std']:12.2e} {row['forward_seconds']:10.2f}"
        )
    if result.get("default_model"):
        keys = (
            "adherence_rate",
            "frame_pass_rate",
            "direction_ok_rate",
            "drift_free_rate",
            "real_time_factor",
        )
        lines.append("")
        lines.append("default model, vidgen eval " + result["eval_args"])
        lines.append(f"{'':22s}" + "".join(f"{v:>12s}" for v in result["default_model"]))
        rows = ("transformer_MiB", *keys)
        for key in rows:
            cells = "".join(
                f"{result['default_model'][v].get(key, float('nan')):12.3f}" for v in result["default_model"]
            )
            lines.append(f"{key:22s}{cells}")
    return "\n".join(lines)


def save_plot(result: dict, path: Path) -> None:
    """Weight memory and output error per variant, side by side."""
    from vidgen.plotting import pyplot

    plt = pyplot()

    rows = result["wan_geometry"]["variants"]
    names = list(rows)
    fig, (memory, error) = plt.subplots(1, 2, figsize=(9, 3.5))
    memory.bar(names, [rows[n]["weights_30_blocks_GiB"] for n in names], color="tab:blue")
    memory.set_ylabel("GiB (Wan 1.3B, 30 blocks)")
    memory.set_title("weight memory")
    error.bar(names, [rows[n]["relative_error"] for n in names], color="tab:orange")
    error.set_ylabel("||y - y_fp32|| / ||y_fp32||")
    error.set_title("output error vs float32")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        result: dict = {
            "wan_geometry": wan_geometry(args.layers, args.frames, args.latent_side, args.seed, device)
        }
        if args.eval_prompts:
            result["eval_args"] = f"--held-out {args.eval_prompts} --seconds {args.eval_seconds:g}"
            result["default_model"] = default_model_eval(
                args.eval_prompts, args.eval_seconds, args.seed, out_dir / "quantize"
            )
    except QuantizationUnavailable as err:
        print(f"vidgen bench quantize: error: {err}")
        return 2
    print(format_table(result))
    path, png = out_dir / "quantize.json", out_dir / "quantize.png"
    path.write_text(json.dumps(result, indent=2))
    save_plot(result, png)
    print(f"table: {path}\nplot:  {png}")
    return 0
