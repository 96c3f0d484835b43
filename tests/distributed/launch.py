"""Run a function on several CPU processes joined by torch.distributed (gloo, ``file://`` rendezvous)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp


def _entry(rank: int, fn: Callable[..., None], world_size: int, folder: str, args: tuple[Any, ...]) -> None:
    for name, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("VIDGEN_FLEX_COMPILE", "0")):
        os.environ.setdefault(name, value)
    torch.set_num_threads(1)
    import torch.distributed as dist

    try:
        fn(rank, world_size, f"file://{Path(folder) / 'rendezvous'}", Path(folder), *args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[..., None], world_size: int, folder: Path, *args: Any) -> None:
    """Call ``fn(rank, world_size, init_method, folder, *args)`` in ``world_size`` fresh processes;
    ``init_method`` is a ``file://`` rendezvous in ``folder`` (nothing listens on a port).

    ``fn`` must be a module-level function (the processes import it); an exception in any rank
    fails the call with that rank's traceback.
    """
    mp.spawn(_entry, args=(fn, world_size, str(folder), args), nprocs=world_size)
