"""``vidgen convert``: a published ``.pt`` training checkpoint (Self Forcing, CausVid, LongLive,
Rolling Forcing...) to a diffusers-format transformer folder that ``--transformer`` loads.

The checkpoint is read with ``torch.load(weights_only=True)``: one that needs arbitrary unpickling
is refused (exit 2) and nothing in it runs.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from vidgen.validation import InputError, parse_json, read_text_file


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="convert a .pt training checkpoint to a diffusers transformer folder")
    p.add_argument("checkpoint", metavar="CHECKPOINT.pt", help="the published checkpoint")
    p.add_argument("out_dir", metavar="OUT_DIR", help="folder to write (config.json + safetensors)")
    p.add_argument(
        "--key",
        help="where the weights are in the checkpoint: generator_ema, generator, model... "
        "(default: the first of these present)",
    )
    p.add_argument("--lora", metavar="LORA.pt[:SCALE]", help="a LoRA to fuse in (e.g. LongLive's lora.pt)")
    p.add_argument(
        "--dtype", choices=["bf16", "fp16", "fp32"], default="bf16", help="weights' dtype (default bf16)"
    )
    p.add_argument(
        "--config",
        metavar="config.json",
        help="a config.json as published (Wan 2.1's, diffusers', a causal repository's): its geometry "
        "keys are used (needed if heads are not 128 channels), the others reported and ignored",
    )
    p.add_argument("--force", action="store_true", help="write into an OUT_DIR that already has files")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from vidgen.config import MAX_LORA_SCALE, parse_lora_spec
    from vidgen.models.convert import convert_checkpoint, ignored_config_keys

    checkpoint, out = Path(args.checkpoint), Path(args.out_dir)
    if not checkpoint.is_file():
        raise InputError(f"no checkpoint at {checkpoint}")
    if out.exists() and not out.is_dir():
        raise InputError(f"OUT_DIR {out} is a file, not a folder: choose a folder to write")
    if out.exists() and any(out.iterdir()) and not args.force:
        raise InputError(f"{out} is not empty: choose another OUT_DIR or pass --force")
    config = None
    if args.config:
        config = parse_json(read_text_file(args.config, "--config"), f"--config {args.config}")
        if not isinstance(config, dict):
            raise InputError(
                f"--config {args.config} must hold a JSON object of settings, not a {type(config).__name__}"
            )
    if config is not None:
        try:
            ignored = ignored_config_keys(config)
        except ValueError as err:
            raise InputError(f"--config {args.config}: {err}") from None
        if ignored:
            print(
                "vidgen convert: --config keys not used (not the weights' geometry): "
                + "; ".join(f"{k} ({why})" for k, why in ignored.items()),
                file=sys.stderr,
            )
    lora, scale = parse_lora_spec(args.lora) if args.lora else (None, 1.0)
    if not (math.isfinite(scale) and abs(scale) <= MAX_LORA_SCALE):  # as model.loras is checked
        raise InputError(
            f"--lora: a LoRA's scale must be a finite number between -{MAX_LORA_SCALE:g} and "
            f"{MAX_LORA_SCALE:g}, got {scale!r}"
        )
    try:
        model = convert_checkpoint(
            checkpoint, out, key=args.key, lora=lora, lora_scale=scale, dtype=args.dtype, config=config
        )
    except (OSError, ValueError) as err:
        message = str(err)
        if args.config and message.startswith("config: "):  # the geometry check calls it "config"
            message = f"--config {args.config}: " + message.removeprefix("config: ")
        raise InputError(message) from None
    c = model.config
    print(
        f"vidgen convert: wrote {out} ({c.num_layers} layers, {c.num_attention_heads} heads of "
        f"{c.attention_head_dim}, {args.dtype}); use it with --transformer {out}",
        file=sys.stderr,
    )
    return 0
