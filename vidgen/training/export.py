"""Assemble a pipeline folder (the shipped default model) from trained parts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from vidgen.config import load_config
from vidgen.models import CausalWanTransformer
from vidgen.models.autoencoder import AutoencoderKLLite
from vidgen.models.text_encoders import MiniLMTextEncoder
from vidgen.pipelines.loading import save_components

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


_WEIGHTS = {"ema": "ema.safetensors", "raw": "model.safetensors"}


def export_pipeline(
    transformer_run: str | Path,
    autoencoder: str | Path,
    out: str | Path,
    dtype: str = "float16",
    weights: str = "ema",
) -> Path:
    """Write ``out`` with the transformer run's ``weights`` (``ema``, or ``raw``: the weights of the
    step itself, for a branch younger than the EMA's horizon), stored in ``dtype`` (the pipeline
    loads them in its runtime dtype), the finalized autoencoder and the default preset (sampling in
    float32) as ``vidgen.toml``. A ``MODEL_CARD.md`` already in ``out`` is kept."""
    if weights not in _WEIGHTS:
        raise ValueError(f"weights must be one of {sorted(_WEIGHTS)}, got {weights!r}")
    latest = Path(transformer_run) / "latest"
    state = json.loads((latest / "state.json").read_text())
    transformer = CausalWanTransformer.from_config(CausalWanTransformer.load_config(latest))
    transformer.load_state_dict(load_file(str(latest / _WEIGHTS[weights])))
    vae = AutoencoderKLLite.from_pretrained(str(autoencoder))
    config = load_config("default")
    train = state["config"]
    config = config.replace(
        **{
            "generation.chunk_frames": train["chunk_frames"],
            "generation.sink_frames": train["sink_frames"],
            "generation.window_frames": train["window_frames"],
            "model.text_max_length": train["text_max_length"],
            # float32 sampling: under "auto" a CPU with native bfloat16 autocasts, and a rollout
            # then follows the CPU's kernels, so a seed's video differs between machines (model
            # card, Diagnosis, stop 43); the embedded model's size costs float32 no time
            "runtime.autocast": "off",
        }
    )
    out = Path(out)
    for sub in ("transformer", "vae"):
        shutil.rmtree(out / sub, ignore_errors=True)
    text_encoder = MiniLMTextEncoder.__new__(MiniLMTextEncoder)  # nothing of it is saved
    # nn.Module.to, not diffusers' override: its warning about modules to keep in float32 is for
    # running in that dtype; this is storage only, and the pipeline loads every weight in float32
    stored = [torch.nn.Module.to(model, _DTYPES[dtype]) for model in (transformer, vae)]
    save_components(out, *stored, text_encoder, config)
    (out / "training_state.json").write_text(
        json.dumps(
            {
                "transformer_step": state["step"],
                "transformer_wall_hours": state["wall_seconds"] / 3600,
                "transformer_weights": weights,
            },
            indent=1,
        )
    )
    return out


_WEIGHTS_FILE = Path("transformer") / "diffusion_pytorch_model.safetensors"


def average_pipelines(folders: list[str | Path], out: str | Path, dtype: str = "float16") -> Path:
    """A model soup: ``out``, a copy of the first pipeline folder whose transformer weights are the
    mean, in float32, of the folders' transformers (students of one recipe from other seeds, say),
    stored in ``dtype``. The transformers must share one architecture (``config.json``); the first
    folder's autoencoder, text encoder and settings are kept, and ``training_state.json`` lists the
    folders averaged."""
    from safetensors.torch import save_file

    if len(folders) < 2:
        raise ValueError(f"averaging needs at least two pipeline folders, got {len(folders)}")
    paths = [Path(f) for f in folders]
    for path in paths:
        if not (path / _WEIGHTS_FILE).is_file():
            raise FileNotFoundError(f"{path}: no {_WEIGHTS_FILE} (a pipeline folder's transformer)")
    out = Path(out)
    if out.resolve() in {p.resolve() for p in paths}:
        raise ValueError(f"{out} is one of the folders averaged: write the soup elsewhere")
    config = json.loads((paths[0] / "transformer" / "config.json").read_text())
    total: dict[str, torch.Tensor] = {}
    for path in paths:
        other = json.loads((path / "transformer" / "config.json").read_text())
        differing = sorted(
            k for k in config.keys() | other.keys() if not k.startswith("_") and config.get(k) != other.get(k)
        )
        if differing:
            raise ValueError(
                f"{path}: another transformer architecture than {paths[0]} ({', '.join(differing)})"
            )
        weights = load_file(str(path / _WEIGHTS_FILE))
        if total and weights.keys() != total.keys():
            raise ValueError(f"{path}: other weight names than {paths[0]}")
        for name, value in weights.items():
            total[name] = total[name] + value.float() if name in total else value.float()
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(paths[0], out)
    mean = {name: (value / len(paths)).to(_DTYPES[dtype]).contiguous() for name, value in total.items()}
    save_file(mean, str(out / _WEIGHTS_FILE), metadata={"format": "pt"})
    state_file = out / "training_state.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    state["averaged_from"] = [str(p) for p in paths]
    state_file.write_text(json.dumps(state, indent=1))
    return out
