"""``vidgen convert``'s work: a published training checkpoint (``.pt``) to a diffusers-format
transformer folder (``config.json`` + safetensors) that ``CausalWanTransformer.from_pretrained`` and
``--transformer`` load.

The checkpoint is read with ``torch.load(weights_only=True)`` only (:func:`load_weights_file`); the
generator's weights are found under the usual keys (``generator_ema``, ``generator``, ``model``...),
training wrappers (FSDP, activation checkpointing) are stripped from their names, the original Wan
layout is mapped to diffusers' names, and the geometry is read from the tensor shapes (heads of 128
channels) unless a config gives it. An optional LoRA (LongLive's ``lora.pt``...) is fused in.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch

from vidgen.models import wan_checkpoint
from vidgen.models.lora import check_lora_keys, normalize_lora_state_dict, read_lora_file
from vidgen.models.transformer import CausalWanTransformer

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _config_parts(config: dict) -> tuple[dict, dict]:
    """A user's config.json split into (diffusers-named overrides, Wan-named original config)."""
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    known = set(inspect.signature(CausalWanTransformer.__init__).parameters) & set(config)
    wan_names = set(wan_checkpoint.WAN_CONFIG_NAMES) | {"dim", "model_type"}
    unknown = sorted(set(config) - known - wan_names)
    if unknown:
        raise ValueError(f"unknown config keys {unknown}: give diffusers' or Wan's config names")
    return {k: config[k] for k in known}, {k: v for k, v in config.items() if k in wan_names}


def convert_checkpoint(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    key: str | None = None,
    lora: str | Path | None = None,
    lora_scale: float = 1.0,
    dtype: str = "bf16",
    config: dict | None = None,
) -> CausalWanTransformer:
    """Write ``out_dir`` (diffusers layout) from ``checkpoint``; returns the model written.
    Raises ``ValueError`` / ``FileNotFoundError`` with a message that says what is wrong."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    path = Path(checkpoint)
    state = wan_checkpoint.find_state_dict(wan_checkpoint.load_weights_file(path), key)
    if wan_checkpoint.is_original_layout(list(state)):
        state = wan_checkpoint.convert_original_state_dict(state)
    else:  # diffusers names already: only training wrappers and a "model." prefix to drop
        state = {wan_checkpoint.strip_wrappers(k).removeprefix("model."): v for k, v in state.items()}
    if "patch_embedding.weight" not in state:
        raise ValueError(f"{path}: no Wan 2.1 transformer weights found (e.g. {sorted(state)[:3]})")

    overrides, original = _config_parts(config or {})
    geometry = wan_checkpoint.config_from_original(None, state, overrides, original=original)
    with torch.device("meta"):
        model = CausalWanTransformer(**geometry)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(
            f"{path} does not match a Wan 2.1 transformer of geometry {geometry}: "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    model = model.float().eval()

    if lora is not None:  # fused in float32, before the cast
        adapter = normalize_lora_state_dict(read_lora_file(lora))
        check_lora_keys(model, adapter)
        model.load_lora_adapter(adapter, adapter_name="convert")
        model.fuse_lora(lora_scale=lora_scale)
        model.unload_lora()

    keep = CausalWanTransformer._keep_in_fp32_modules  # as diffusers keeps them when loading
    for name, param in model.named_parameters():
        if not any(part in keep for part in name.split(".")):
            param.data = param.data.to(DTYPES[dtype])
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    (out / "conversion.json").write_text(
        json.dumps({"source": str(path), "key": key, "lora": str(lora) if lora else None, "dtype": dtype})
    )
    return model
