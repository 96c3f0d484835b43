"""vidgen.distributed: running the pipeline on several processes.

Sequence parallelism (:mod:`vidgen.distributed.sequence_parallel`) splits one video's tokens across
the processes of a group. Nothing heavy happens at import (no Ray, no model code): the public names
below are resolved lazily.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "ParallelConfig": "vidgen.distributed.sequence_parallel",
    "SequenceParallelGroup": "vidgen.distributed.sequence_parallel",
    "communication_volume": "vidgen.distributed.sequence_parallel",
    "init_process_group": "vidgen.distributed.sequence_parallel",
    "validate_degrees": "vidgen.distributed.sequence_parallel",
    "SequenceParallelTransformer": "vidgen.distributed.parallel_stream",
    "sequence_parallel_stream": "vidgen.distributed.parallel_stream",
    # the Ray executor backend (Ray itself is imported only when these run)
    "RayParallelism": "vidgen.distributed.ray_cluster",
    "render_on_ray": "vidgen.distributed.render",
    "JobDefaults": "vidgen.distributed.batch",
    "read_jobs": "vidgen.distributed.batch",
    "render_batch_on_ray": "vidgen.distributed.batch",
    "run_batch": "vidgen.distributed.batch",
}

if TYPE_CHECKING:  # pragma: no cover
    from vidgen.distributed.batch import JobDefaults, read_jobs, render_batch_on_ray, run_batch
    from vidgen.distributed.parallel_stream import SequenceParallelTransformer, sequence_parallel_stream
    from vidgen.distributed.ray_cluster import RayParallelism
    from vidgen.distributed.render import render_on_ray
    from vidgen.distributed.sequence_parallel import (
        ParallelConfig,
        SequenceParallelGroup,
        communication_volume,
        init_process_group,
        validate_degrees,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vidgen.distributed' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [  # noqa: F822 - resolved lazily by __getattr__
    "JobDefaults",
    "ParallelConfig",
    "RayParallelism",
    "SequenceParallelGroup",
    "SequenceParallelTransformer",
    "communication_volume",
    "init_process_group",
    "read_jobs",
    "render_batch_on_ray",
    "render_on_ray",
    "run_batch",
    "sequence_parallel_stream",
    "validate_degrees",
]
