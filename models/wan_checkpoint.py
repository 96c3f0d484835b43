"""Reading Wan 2.1 transformer checkpoints: diffusers layout or the original Wan key layout.

The original layout is the one of the Wan repository and of the causal checkpoints built on it
(Self Forcing, CausVid, LongLive): ``blocks.N.self_attn.q``, ``blocks.N.ffn.0``, ``head.head``...,
sometimes under a ``model.`` or ``model.diffusion_model.`` prefix. Models load from safetensors
only; the published ``.pt`` training checkpoints are read by ``vidgen convert`` (and LoRA loading)
through :func:`load_weights_file`, which uses ``torch.load(weights_only=True)``: tensors and plain
containers, never arbitrary unpickling.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import warnings
import zipfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

# (original pattern, diffusers replacement), applied in order to each key
_RENAMES: list[tuple[str, str]] = [
    (r"^text_embedding\.0\.", "condition_embedder.text_embedder.linear_1."),
    (r"^text_embedding\.2\.", "condition_embedder.text_embedder.linear_2."),
    (r"^time_embedding\.0\.", "condition_embedder.time_embedder.linear_1."),
    (r"^time_embedding\.2\.", "condition_embedder.time_embedder.linear_2."),
    (r"^time_projection\.1\.", "condition_embedder.time_proj."),
    (r"^head\.head\.", "proj_out."),
    (r"^head\.modulation$", "scale_shift_table"),
    (r"\.self_attn\.", ".attn1."),
    (r"\.cross_attn\.", ".attn2."),
    (r"\.attn([12])\.([qkv])\.", r".attn\1.to_\2."),
    (r"\.attn([12])\.o\.", r".attn\1.to_out.0."),
    (r"^(blocks\.\d+)\.norm3\.", r"\1.norm2."),  # Wan's norm3 is the cross-attention norm
    (r"^(blocks\.\d+)\.ffn\.0\.", r"\1.ffn.net.0.proj."),
    (r"^(blocks\.\d+)\.ffn\.2\.", r"\1.ffn.net.2."),
    (r"^(blocks\.\d+)\.modulation$", r"\1.scale_shift_table"),
]
_PREFIXES = ("model.diffusion_model.", "diffusion_model.", "model.")
# Wrappers that training code leaves in parameter names (FSDP, activation checkpointing, torch.compile)
_WRAPPER_FRAGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
# Where training checkpoints keep the generator's weights, most preferred first
STATE_DICT_KEYS = ("generator_ema", "generator", "model", "state_dict", "module", "ema")
PICKLE_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt"}

# original config name -> diffusers config name
WAN_CONFIG_NAMES = {
    "in_dim": "in_channels",
    "out_dim": "out_channels",
    "ffn_dim": "ffn_dim",
    "freq_dim": "freq_dim",
    "text_dim": "text_dim",
    "num_heads": "num_attention_heads",
    "num_layers": "num_layers",
    "eps": "eps",
    "patch_size": "patch_size",
    "cross_attn_norm": "cross_attn_norm",
}
WAN_HEAD_DIM = 128  # every released Wan 2.1 size uses 128 channels per head


def strip_wrappers(key: str) -> str:
    for fragment in _WRAPPER_FRAGMENTS:
        key = key.replace(fragment, "")
    return key


def original_to_diffusers_key(key: str) -> str:
    key = strip_wrappers(key)
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix) :]
            break
    for pattern, replacement in _RENAMES:
        key = re.sub(pattern, replacement, key)
    return key


def convert_original_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename an original-layout Wan 2.1 state dict to diffusers' names (tensors are not copied)."""
    converted = {original_to_diffusers_key(k): v for k, v in state_dict.items()}
    unsupported = [k for k in converted if k.startswith("img_emb") or ".k_img" in k or ".v_img" in k]
    if unsupported:
        raise ValueError(
            f"image-conditioned (I2V) Wan checkpoints are not supported (found {unsupported[0]})"
        )
    return converted


def is_original_layout(keys: list[str]) -> bool:
    return any(".self_attn." in k or ".cross_attn." in k or k.endswith("head.head.weight") for k in keys)


def safetensors_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint file or directory; refuses pickled checkpoints."""
    if path.is_file():
        if path.suffix != ".safetensors":
            raise ValueError(
                f"{path}: only .safetensors checkpoints are loaded; convert a .pt once with `vidgen convert`"
            )
        return [path]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in path.iterdir() if p.suffix in {".bin", ".pt", ".pth", ".ckpt"})
        hint = f" (found pickled {pickled[0]}: convert it with `vidgen convert`)" if pickled else ""
        raise FileNotFoundError(f"no .safetensors weights in {path}{hint}")
    return files


def load_weights_file(path: Path) -> dict:
    """The contents of a ``.safetensors`` file, or of a pickled ``.pt`` read with
    ``torch.load(weights_only=True)``: a checkpoint that needs arbitrary unpickling (classes, code) is
    refused with a ``ValueError`` and nothing in it runs."""
    if not path.is_file():
        raise FileNotFoundError(f"no file at {path}")
    if path.suffix == ".safetensors":
        return load_state_dict([path])
    if path.suffix not in PICKLE_SUFFIXES:
        raise ValueError(f"{path}: expected a .safetensors or {'/'.join(sorted(PICKLE_SUFFIXES))} file")
    try:  # mmap: a 5 GB checkpoint is not read into memory at once (zip-format files only)
        with warnings.catch_warnings():  # torch warns about pickle protocols before refusing
            warnings.simplefilter("ignore")
            data = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL ([\w.]+)", str(err))  # the wording varies across torch versions
        what = f" (it references {found[1]})" if found else ""
        raise ValueError(
            f"{path}: refused: loading it needs arbitrary unpickling{what}, which could run code; "
            "only tensors and plain containers are read"
        ) from None
    except (RuntimeError, OSError, EOFError) as err:  # not a torch file, truncated...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{path}: cannot read it as a torch checkpoint: {first}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a {type(data).__name__}, not a dict of weights")
    return data


def find_state_dict(data: dict, key: str | None = None) -> dict[str, torch.Tensor]:
    """The weights inside a training checkpoint: under ``key`` when given, else the first of
    :data:`STATE_DICT_KEYS` present (Self Forcing / Rolling Forcing ``generator_ema`` and ``generator``,
    CausVid ``generator``, LongLive ``generator``...), else the top level when it holds tensors."""
    if key is not None:
        if not isinstance(data.get(key), dict):
            found = sorted(k for k, v in data.items() if isinstance(v, dict))
            raise ValueError(f"no state dict under key {key!r}; dicts found under: {found or 'none'}")
        data = data[key]
    else:
        for candidate in STATE_DICT_KEYS:
            if isinstance(data.get(candidate), dict) and data[candidate]:
                data = data[candidate]
                break
    tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ValueError(f"no tensors found (keys: {sorted(map(str, data))[:6]}); pass --key to choose one")
    return tensors


def checkpoint_keys(files: list[Path]) -> list[str]:
    keys: list[str] = []
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                keys.extend(f.keys())
        except Exception as err:  # safetensors raises several error types for damaged files
            raise ValueError(f"cannot read weights from {file}: {err}") from err
    return keys


def load_state_dict(files: list[Path]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except Exception as err:  # safetensors raises several error types for damaged files
            raise ValueError(f"cannot read weights from {file}: {err}") from err
    return state


def config_from_original(
    path: Path | None,
    state_dict: dict[str, torch.Tensor],
    overrides: dict | None = None,
    original: dict | None = None,
) -> dict:
    """diffusers-style config for a (converted) original-layout state dict: ``overrides`` first
    (diffusers' names), then ``original`` (Wan's names: dim, num_heads, ...; by default the
    config.json next to ``path`` when there is one), then the tensor shapes (heads of 128 channels,
    as in every released Wan 2.1 size)."""
    source = "config"
    if original is None and path is not None:
        config_file = (path if path.is_dir() else path.parent) / "config.json"
        original = json.loads(config_file.read_text()) if config_file.is_file() else {}
        source = str(config_file)
    original = original or {}
    if "model_type" in original and original["model_type"] not in ("t2v", None):
        raise ValueError(f"{source}: model_type={original['model_type']!r} is not supported (only t2v)")
    config = {new: original[old] for old, new in WAN_CONFIG_NAMES.items() if old in original}
    config.update(overrides or {})

    weight = state_dict["patch_embedding.weight"]  # (dim, in_channels, p_t, p_h, p_w)
    dim = original.get("dim", weight.shape[0])
    if "num_attention_heads" not in config and dim % WAN_HEAD_DIM:
        raise ValueError(
            f"the model is {dim} channels wide, not a whole number of {WAN_HEAD_DIM}-channel heads: "
            "give its geometry (num_attention_heads) in a config"
        )
    config.setdefault("in_channels", weight.shape[1])
    config.setdefault("patch_size", list(weight.shape[2:]))
    config.setdefault("num_attention_heads", dim // WAN_HEAD_DIM)
    config.setdefault("attention_head_dim", dim // config["num_attention_heads"])
    config.setdefault("text_dim", state_dict["condition_embedder.text_embedder.linear_1.weight"].shape[1])
    config.setdefault("freq_dim", state_dict["condition_embedder.time_embedder.linear_1.weight"].shape[1])
    config.setdefault("ffn_dim", state_dict["blocks.0.ffn.net.0.proj.weight"].shape[0])
    config.setdefault(
        "num_layers", 1 + max(int(k.split(".")[1]) for k in state_dict if k.startswith("blocks."))
    )
    out_features = state_dict["proj_out.weight"].shape[0]
    config.setdefault("out_channels", out_features // int(torch.tensor(config["patch_size"]).prod()))
    config.setdefault("cross_attn_norm", "blocks.0.norm2.weight" in state_dict)
    check_geometry(config, state_dict, source)
    return config


_GEOMETRY_INTS = (
    "num_attention_heads",
    "attention_head_dim",
    "in_channels",
    "out_channels",
    "text_dim",
    "freq_dim",
    "ffn_dim",
    "num_layers",
)


def check_geometry(config: dict, state_dict: dict[str, torch.Tensor], source: str = "config") -> None:
    """``ValueError`` in one line naming the first key of ``config`` that the tensors of
    ``state_dict`` contradict (a count that is not a positive integer, a depth or width the weights
    do not have), before any model is built from it: a config asking for a million blocks is refused
    here, not allocated."""
    for key in _GEOMETRY_INTS:
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{source}: {key} must be a positive integer, got {value!r}")
    patch = config.get("patch_size")
    if (
        not isinstance(patch, (list, tuple))
        or len(patch) != 3
        or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 1 for p in patch)
    ):
        raise ValueError(f"{source}: patch_size must be three positive integers, got {patch!r}")
    embed = state_dict["patch_embedding.weight"]
    blocks = 1 + max((int(k.split(".")[1]) for k in state_dict if k.startswith("blocks.")), default=-1)
    implied = {
        "num_layers": blocks,
        "in_channels": embed.shape[1],
        "patch_size": list(embed.shape[2:]),
        "text_dim": state_dict["condition_embedder.text_embedder.linear_1.weight"].shape[1],
        "freq_dim": state_dict["condition_embedder.time_embedder.linear_1.weight"].shape[1],
    }
    if "blocks.0.ffn.net.0.proj.weight" in state_dict:
        implied["ffn_dim"] = state_dict["blocks.0.ffn.net.0.proj.weight"].shape[0]
    for key, value in implied.items():
        if list(config[key]) != value if key == "patch_size" else config[key] != value:
            raise ValueError(f"{source}: {key} is {config[key]!r} but the weights have {value!r}")
    width = config["num_attention_heads"] * config["attention_head_dim"]
    if width != embed.shape[0]:
        raise ValueError(
            f"{source}: num_attention_heads x attention_head_dim is {width} but the weights are "
            f"{embed.shape[0]} channels wide"
        )
    rows = state_dict["proj_out.weight"].shape[0]
    if config["out_channels"] * math.prod(patch) != rows:
        raise ValueError(
            f"{source}: out_channels {config['out_channels']} x patch_size {list(patch)} is not the "
            f"weights' {rows} output rows"
        )
