"""Resumable training state in safetensors + JSON (never pickle): model, EMA, optimizer, step.

A run folder holds ``latest/`` (overwritten at every save, so it stays small enough to keep in the
repository between training stretches) with ``model.safetensors``, ``ema.safetensors``,
``optimizer.safetensors``, ``state.json`` (step, wall time, RNG seed position, optimizer hyper-
parameters, the run's config) and the model's ``config.json``; plus ``log.jsonl``, one line per
logging interval.
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from vidgen.models import CausalWanTransformer


class EMA:
    """Exponential moving average of a model's parameters (kept on the same device, fp32)."""

    def __init__(self, model: nn.Module, decay: float = 0.999) -> None:
        self.decay = decay
        self.model = copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        # warm-up: average over the steps seen so far until the decay takes over
        decay = min(self.decay, (1 + step) / (10 + step))
        for ema_p, p in zip(self.model.parameters(), model.parameters()):
            ema_p.lerp_(p.detach(), 1 - decay)
        for ema_b, b in zip(self.model.buffers(), model.buffers()):
            ema_b.copy_(b)


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for pid, entries in state["state"].items():
        for name, value in entries.items():
            if torch.is_tensor(value):
                tensors[f"{pid}.{name}"] = value.contiguous()
            else:
                scalars[f"{pid}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _restore_optimizer(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict
) -> None:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        pid, name = key.split(".", 1)
        state.setdefault(int(pid), {})[name] = value
    for key, value in meta["scalars"].items():
        pid, name = key.split(".", 1)
        state.setdefault(int(pid), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_training_state(
    run_dir: str | os.PathLike,
    *,
    model: nn.Module,
    ema: EMA | None,
    optimizer: torch.optim.Optimizer,
    step: int,
    wall_seconds: float,
    config: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``run_dir/latest`` atomically (a temporary folder renamed into place)."""
    run_dir = Path(run_dir)
    tmp = run_dir / "latest.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
    if ema is not None:
        save_file(
            {k: v.contiguous() for k, v in ema.model.state_dict().items()}, str(tmp / "ema.safetensors")
        )
    opt_tensors, opt_meta = _optimizer_tensors(optimizer)
    save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
    if hasattr(model, "save_config"):
        model.save_config(tmp)
    state = {
        "step": step,
        "wall_seconds": wall_seconds,
        "config": config,
        "optimizer": opt_meta,
        **(extra or {}),
    }
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    final = run_dir / "latest"
    old = run_dir / "latest.old"
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    if old.exists():
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    return final


def load_training_state(
    run_dir: str | os.PathLike, *, model: nn.Module, ema: EMA | None, optimizer: torch.optim.Optimizer | None
) -> dict[str, Any] | None:
    """Restore from ``run_dir/latest`` if it exists; returns its state.json, else None."""
    latest = Path(run_dir) / "latest"
    if not (latest / "state.json").is_file():
        return None
    state = json.loads((latest / "state.json").read_text())
    added = _load_weights(model, latest / "model.safetensors")
    if ema is not None and (latest / "ema.safetensors").is_file():
        _load_weights(ema.model, latest / "ema.safetensors")
    elif ema is not None:  # a compact checkpoint of the weights alone: the average starts from them
        ema.model.load_state_dict(model.state_dict())
    if added:
        # Adam's saved moments are numbered by parameter and the new ones shift the numbers
        print(
            f"resuming with new parameters {', '.join(added)} (as created: the added path starts at zero); Adam restarts",
            flush=True,
        )
    groups = state.get("optimizer", {}).get("param_groups")
    regrouped = optimizer is not None and groups is not None and len(groups) != len(optimizer.param_groups)
    if regrouped:
        # a part now learning at its own rate (or no longer) has moved to another group
        print(
            "resuming with the parameters grouped otherwise (an lr scale changed); Adam restarts", flush=True
        )
    if optimizer is not None and (latest / "optimizer.safetensors").is_file() and not added and not regrouped:
        _restore_optimizer(optimizer, load_file(str(latest / "optimizer.safetensors")), state["optimizer"])
    elif optimizer is not None:
        # a compact checkpoint (see export_compact_checkpoint): Adam restarts, with a short warm-up
        state["restart_warmup"] = True
    return state


ADDABLE_PARAMETERS = frozenset(
    {
        "spatial_pos",
        "text_to_modulation.weight",
        "text_to_modulation.bias",
        "text_to_velocity.score.weight",
        "text_to_velocity.score.bias",
        "text_to_velocity.value.weight",
        "text_to_velocity.value.bias",
        "velocity_gain",
    }
)
"""Parameters a run may gain when it resumes (each starts at zero, where the model computes what it
did without it): the transformer's position table (``--spatial-pos true``) and its text modulation
(``--text-modulation true``)."""


def _load_weights(model: nn.Module, path: Path) -> list[str]:
    """Load ``path`` into ``model``; returns the addable parameters the file does not have."""
    missing, unexpected = model.load_state_dict(as_float(load_file(str(path))), strict=False)
    wrong = [k for k in missing if k not in ADDABLE_PARAMETERS]
    if wrong or unexpected:
        raise RuntimeError(f"{path} does not fit the model: missing {wrong[:5]}, unexpected {unexpected[:5]}")
    return sorted(missing)


def as_float(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}


def load_transformer(path: str | os.PathLike) -> CausalWanTransformer:
    """A causal transformer's float32 weights from a pipeline or distillation run folder
    (``transformer/``), a transformer training run (``latest/``, its EMA) or a transformer folder."""
    path = Path(path).expanduser()
    if (path / "transformer" / "config.json").is_file():
        return CausalWanTransformer.from_pretrained(path / "transformer").float()
    if (path / "latest" / "ema.safetensors").is_file():
        model = CausalWanTransformer.from_config(CausalWanTransformer.load_config(path / "latest"))
        model.load_state_dict(as_float(load_file(str(path / "latest" / "ema.safetensors"))))
        return model
    return CausalWanTransformer.from_pretrained(path).float()


def export_compact_checkpoint(
    run_dir: str | os.PathLike, out_dir: str | os.PathLike, *, with_ema: bool = True
) -> Path:
    """Copy ``run_dir/latest`` without the optimizer and with the weights and the EMA in float16:
    small enough to keep in the repository between training stretches (``vidgen train ...
    --run-dir OUT_DIR`` continues from it, in float32; Adam's moments restart with a short
    warm-up). float16 keeps 11 bits of each weight, far below what one optimiser step changes.
    ``with_ema=False`` keeps the weights alone (half the size; a run resumed from it starts its
    average from them): for a model too large to keep both within the repository's budget."""
    latest = Path(run_dir) / "latest"
    target = Path(out_dir) / "latest"
    target.mkdir(parents=True, exist_ok=True)
    (target / "ema.safetensors").unlink(missing_ok=True)  # an earlier copy's, when written without
    for name in ("model.safetensors", "ema.safetensors") if with_ema else ("model.safetensors",):
        tensors = load_file(str(latest / name))
        save_file(
            {k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}, str(target / name)
        )
    for name in ("state.json", "config.json"):
        if (latest / name).is_file():
            (target / name).write_text((latest / name).read_text())
    log = Path(run_dir) / "log.jsonl"
    if log.is_file():
        (Path(out_dir) / "log.jsonl").write_text(log.read_text())
    return target


class RunLog:
    """Appends JSON lines to ``run_dir/log.jsonl`` and prints a short line."""

    def __init__(self, run_dir: str | os.PathLike, quiet: bool = False) -> None:
        self.path = Path(run_dir) / "log.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.quiet = quiet

    def write(self, **record: Any) -> None:
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **record}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if not self.quiet:
            shown = " ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()
            )
            print(shown, flush=True)
