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


# keys of published config.json files that say nothing about the weights' geometry, and where vidgen
# keeps what they mean instead
NOT_GEOMETRY = {
    "text_len": "prompt length: the config's model.text_max_length",
    "local_attn_size": "attention window: the preset's generation.sink_frames + window_frames + chunk_frames",
    "sink_size": "attention sink: the preset's generation.sink_frames",
    "num_frame_per_block": "chunk size: the preset's generation.chunk_frames",
    "window_size": "Wan's bidirectional window (-1, -1): unused by a causal model",
    "timestep_shift": "the preset's generation.shift",
    "model_type": "t2v, checked",
}


def _config_parts(config: object) -> tuple[dict, dict, dict[str, str]]:
    """A published config.json (Wan 2.1's, diffusers', a causal repository's) split into
    (diffusers-named overrides, Wan-named original config, ignored key -> why)."""
    if not isinstance(config, dict):
        raise ValueError(f"the config must be a JSON object of settings, not a {type(config).__name__}")
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    if isinstance(config.get("qk_norm"), bool):  # Wan's flag: its RMSNorm over all heads
        config["qk_norm"] = "rms_norm_across_heads" if config["qk_norm"] else None
    known = set(inspect.signature(CausalWanTransformer.__init__).parameters) & set(config)
    wan_names = set(wan_checkpoint.WAN_CONFIG_NAMES) | {"dim", "model_type"}
    ignored = {
        k: NOT_GEOMETRY.get(k, "not a setting of the weights") for k in config if k not in known | wan_names
    }
    if "model_type" in config:
        ignored.pop("model_type", None)
    return (
        {k: config[k] for k in known},
        {k: v for k, v in config.items() if k in wan_names},
        ignored,
    )


def ignored_config_keys(config: object) -> dict[str, str]:
    """The keys of a config.json that conversion does not use, each with where vidgen keeps what
    it means (``vidgen convert`` reports them)."""
    return _config_parts(config)[2]


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
    ``config``: a published config.json's settings; the geometry's keys are used, the others
    (:func:`ignored_config_keys`) are not. Raises ``ValueError`` / ``FileNotFoundError`` with a
    message that says what is wrong."""
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

    overrides, original, _ = _config_parts(config or {})
    geometry = wan_checkpoint.config_from_original(None, state, overrides, original=original)
    with torch.device("meta"):
        model = CausalWanTransformer(**geometry)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as err:  # a size mismatch the geometry check does not see
        first = next((line.strip() for line in str(err).splitlines() if "size mismatch" in line), str(err))
        raise ValueError(f"{path} does not fit the geometry {geometry}: {first}") from None
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
