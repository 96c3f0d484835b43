"""LoRA state dicts for the causal Wan transformer: read them safely, bring any published layout to
diffusers' names, and check every key against the model before peft sees it.

Layouts accepted (``normalize_lora_state_dict``):

* diffusers / peft: ``transformer.blocks.0.attn1.to_q.lora_A.weight`` (or without ``transformer.``);
* the original Wan layout: ``blocks.0.self_attn.q.lora_A.weight`` (``lora_down`` / ``lora_up`` too),
  optionally with ``blocks.0.self_attn.q.alpha``, under no prefix or ``diffusion_model.`` /
  ``base_model.model.`` / ``model.``; converted by diffusers' own
  ``_convert_non_diffusers_wan_lora_to_diffusers`` (which folds ``alpha / rank`` into the weights);
* LongLive's ``lora.pt`` (NVlabs/LongLive, ``trainer/distillation.py`` ``save`` and
  ``utils/lora_utils.py``): ``{"generator_lora": ..., "critic_lora": ..., "step": N}``, where
  ``generator_lora`` is ``peft.get_peft_model_state_dict`` of ``peft.get_peft_model`` applied to the
  original-layout ``CausalWanModel``, targeting every ``nn.Linear`` of every attention block
  (self_attn q/k/v/o, cross_attn q/k/v/o, ffn.0, ffn.2): keys
  ``base_model.model.blocks.N.self_attn.q.lora_A.weight``, no alpha keys (the published rank-256
  adapter was trained with ``alpha = rank = 256``, so its scale is 1).

The model side is diffusers' ``PeftAdapterMixin`` (``load_lora_adapter``, ``set_adapters``,
``fuse_lora``...); this module only prepares what it loads.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from vidgen.models.wan_checkpoint import load_weights_file, strip_wrappers

_PREFIXES = ("base_model.model.", "model.diffusion_model.", "diffusion_model.", "model.")

# Keys of the original Wan layout that diffusers' converter maps (anything else is refused by name).
_ORIGINAL_KEY = re.compile(
    r"^(blocks\.\d+\.((self_attn|cross_attn)\.[qkvo]|ffn\.[02])|head\.head|time_projection\.1"
    r"|text_embedding\.[02]|time_embedding\.[02])"
    r"\.((lora_A|lora_B|lora_down|lora_up)\.weight|alpha|diff_b)$"
)
_DIFFUSERS_KEY = re.compile(r"^(?P<module>.+)\.(lora_A\.weight|lora_B\.weight|lora_B\.bias|alpha)$")


def read_lora_file(path: str | Path) -> dict[str, torch.Tensor]:
    """The LoRA tensors of a ``.safetensors`` file or a ``.pt`` read with ``weights_only=True``
    (LongLive's ``{"generator_lora": ...}`` is unwrapped)."""
    data = load_weights_file(Path(path))
    for key in ("generator_lora", "state_dict"):
        if isinstance(data.get(key), dict):
            data = data[key]
            break
    tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ValueError(f"{path} holds no LoRA tensors (top-level keys: {sorted(data)[:5]})")
    return tensors


def _strip(key: str) -> str:
    key = strip_wrappers(key)
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key


def _refuse_unknown(unknown: list[str], what: str) -> None:
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise ValueError(f"{what}: {shown}")


def normalize_lora_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Any accepted layout (module docstring) -> diffusers' ``transformer.<module>.lora_A.weight``
    keys, alphas folded into the weights. Raises ``ValueError`` naming keys it does not know."""
    if state_dict and all(k.startswith("transformer.") for k in state_dict):
        state = {k.removeprefix("transformer."): v for k, v in state_dict.items()}
    else:
        state = {_strip(k): v for k, v in state_dict.items()}
    original = any(re.search(r"(self_attn|cross_attn)\.|ffn\.[02]\.|head\.head\.", k) for k in state)
    if original:
        from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_wan_lora_to_diffusers

        _refuse_unknown(
            [k for k in state_dict if not _ORIGINAL_KEY.match(_strip(k))],
            "unknown keys for an original-layout Wan 2.1 LoRA",
        )
        with_alpha = any(k.endswith(".alpha") for k in state)  # the converter scales in place
        return _convert_non_diffusers_wan_lora_to_diffusers(
            {f"diffusion_model.{k}": v.clone() if with_alpha else v for k, v in state.items()}
        )
    _refuse_unknown([k for k in state_dict if not _DIFFUSERS_KEY.match(_strip(k))], "unknown keys for a LoRA")
    converted = {}
    for key, value in state.items():
        match = _DIFFUSERS_KEY.match(key)
        assert match is not None  # every key matched: the others were refused above
        module = match["module"]
        if key.endswith(".alpha"):
            continue
        alpha = state.get(f"{module}.alpha")
        if alpha is not None and key.endswith("lora_A.weight"):  # peft scales by alpha / rank
            value = value * (float(alpha) / value.shape[0])
        converted[f"transformer.{key}"] = value
    return converted


def check_lora_keys(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Every ``transformer.<module>.lora_*`` key must name a linear layer of ``model`` with matching
    shapes; raises ``ValueError`` naming the first keys that do not."""
    # a layer that already carries an adapter is peft's wrapper around ``<name>.base_layer``
    linears = {
        name.removesuffix(".base_layer"): m for name, m in model.named_modules() if isinstance(m, nn.Linear)
    }
    unknown, mismatched = [], []
    for key, value in state_dict.items():
        match = _DIFFUSERS_KEY.match(key.removeprefix("transformer."))
        layer = linears.get(match["module"]) if match and key.startswith("transformer.") else None
        if layer is None:
            unknown.append(key)
        elif key.endswith("lora_A.weight") and value.shape[1] != layer.in_features:
            mismatched.append(f"{key} {tuple(value.shape)} (layer input {layer.in_features})")
        elif key.endswith("lora_B.weight") and value.shape[0] != layer.out_features:
            mismatched.append(f"{key} {tuple(value.shape)} (layer output {layer.out_features})")
    _refuse_unknown(unknown, "LoRA keys that name no linear layer of the transformer")
    if mismatched:
        raise ValueError(f"LoRA shapes do not match the transformer: {', '.join(mismatched[:3])}")
