"""The optimisation loop both trainers share: learning-rate schedule, clipping, EMA, logging,
checkpoints, a per-stretch time budget and resuming."""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vidgen.training.checkpoint import EMA, RunLog, load_training_state, save_training_state


def cosine_lr(step: int, *, lr: float, warmup: int, steps: int, floor: float) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``floor * lr`` at ``steps``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


class TrainingRun:
    """``config`` needs ``run_dir``, ``steps``, ``minutes``, ``stretch_steps``, ``lr``, ``warmup``,
    ``log_every``, ``save_every`` and ``ema_decay``; ``evaluate`` (optional) runs at every save on
    the EMA model. A stretch ends after ``minutes`` or ``stretch_steps`` (0: no limit), or at the
    first step after SIGTERM or SIGINT, saving first; rerunning continues from the saved state as
    if it had never stopped."""

    def __init__(
        self,
        config: Any,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        lr_floor: float,
        evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
    ) -> None:
        self.config = config
        self.model = model
        self.optimizer = optimizer
        self.lr_floor = lr_floor
        self.evaluate = evaluate
        self.run_dir = Path(config.run_dir)
        self.ema = EMA(model, config.ema_decay)
        state = load_training_state(self.run_dir, model=model, ema=self.ema, optimizer=optimizer)
        self.step = state["step"] if state else 0
        self.wall = state["wall_seconds"] if state else 0.0
        # resumed without optimizer moments (a compact checkpoint): warm up again from here
        self.warmup_from = self.step if state and state.get("restart_warmup") else 0
        self.log = RunLog(self.run_dir)
        self.log.write(
            event="start",
            step=self.step,
            resumed=state is not None,
            params=sum(p.numel() for p in model.parameters()),
        )
        self.started = time.time()
        self.first_step = self.step
        self.last_save = self.step
        self._losses: list[float] = []
        self.stop_requested = False
        self._previous_handlers = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous_handlers[sig] = signal.signal(sig, self._request_stop)

    def _request_stop(self, signum, frame) -> None:
        # finish the step in flight, save, stop: a killed session loses no training
        self.stop_requested = True

    @property
    def done(self) -> bool:
        return self.step >= self.config.steps

    def lr(self, step: int | None = None) -> float:
        c = self.config
        step = self.step if step is None else step
        rate = cosine_lr(step, lr=c.lr, warmup=c.warmup, steps=c.steps, floor=self.lr_floor)
        if self.warmup_from and step - self.warmup_from < c.warmup:
            rate *= (step - self.warmup_from + 1) / c.warmup
        return rate

    def update(self, loss: torch.Tensor, **metrics: float) -> bool:
        """Back-propagate ``loss``, step the optimiser and the EMA, log and save when due.
        Returns False when this stretch's time budget is spent (the state was saved)."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr() * group.get("lr_scale", 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # each parameter group (e.g. a generator and its critic) is clipped on its own
        norms = [torch.nn.utils.clip_grad_norm_(g["params"], 1.0) for g in self.optimizer.param_groups]
        grad_norm = norms[0] if len(norms) == 1 else torch.stack(norms).square().sum().sqrt()
        self.optimizer.step()
        self.ema.update(self.model, self.step)
        self.step += 1
        self._losses.append(loss.item())
        elapsed = time.time() - self.started
        if self.step % self.config.log_every == 0:
            self.log.write(
                step=self.step,
                loss=sum(self._losses) / len(self._losses),
                grad=float(grad_norm),
                lr=self.lr(),
                wall_min=(self.wall + elapsed) / 60,
                **metrics,
            )
            self._losses = []
        stretch = getattr(self.config, "stretch_steps", 0)
        out_of_time = (
            (self.config.minutes > 0 and elapsed > self.config.minutes * 60)
            or (stretch > 0 and self.step - self.first_step >= stretch)
            or self.stop_requested
        )
        if self.step % self.config.save_every == 0 or self.done or out_of_time:
            self.save()
        return not out_of_time

    def save(self) -> None:
        extra = {}
        if self.evaluate is not None:
            metrics = self.evaluate(self.ema.model)
            self.log.write(step=self.step, event="eval", **metrics)
            extra["eval"] = metrics
        save_training_state(
            self.run_dir,
            model=self.model,
            ema=self.ema,
            optimizer=self.optimizer,
            step=self.step,
            wall_seconds=self.wall + time.time() - self.started,
            config=asdict(self.config),
            extra=extra,
        )
        self.last_save = self.step

    def finish(self) -> Path:
        if self.last_save != self.step:
            self.save()
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers = {}
        return self.run_dir / "latest"
