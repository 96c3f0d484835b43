"""Sequence parallelism for a Serve replica: the replica is rank 0, ``sp - 1`` follower actors the rest.

A replica started with ``sp > 1`` (``vidgen serve --backend ray --sp N``) loads the pipeline, starts
one :class:`SessionFollowerActor` per other rank in the bundles of its own placement group (Serve
reserves ``sp`` bundles on one node for each replica, see ``deployment``), and all of them join
one torch.distributed group (gloo on CPU, nccl on GPU) through a ``file://`` rendezvous on that
node. The replica's ``SessionManager`` then runs every session's stream through a
:class:`~vidgen.distributed.session_group.SessionLeader`, whose commands reach the followers as
actor calls (:func:`start_followers`): a follower waits for Ray, not inside a collective, while the
replica has nothing to do. The followers are the replica's actors: they die with it.

:func:`serving_kind` decides Ulysses or ring (``runtime.sp_kind``) and checks the degree from the
model folder's ``config.json`` before anything starts, so a degree the model cannot split is one
line from ``vidgen serve``, not a replica that fails to start.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from vidgen.distributed.ray_worker import PipelineSpec


def serving_kind(spec: PipelineSpec, sp: int) -> str:
    """``"ulysses"`` or ``"ring"`` for ``sp`` ranks of ``spec``'s model (``runtime.sp_kind``), or
    :class:`~vidgen.distributed.ray_cluster.DegreeError` saying what to change. Reads the model
    folder's config files only (no weights)."""
    from vidgen.config import load_config
    from vidgen.distributed.ray_cluster import DegreeError
    from vidgen.distributed.sequence_parallel import resolve_kind, validate_degrees
    from vidgen.pipelines.loading import resolve_model

    folder, config = resolve_model(spec.model, load_config(spec.config) if spec.config else None)
    if spec.overrides:
        config = config.replace(**spec.overrides)
    transformer = json.loads((Path(folder) / "transformer" / "config.json").read_text())
    heads = int(transformer["num_attention_heads"])
    try:
        kind = resolve_kind(config.runtime.sp_kind, heads, sp)
        validate_degrees(transformer, sp, 1, sp, kind=kind)
    except ValueError as err:
        raise DegreeError(f"--sp {sp}: {err}") from None
    return kind


class SessionFollowerActor:
    """Rank ``rank`` (1 .. sp - 1) of a replica: the pipeline, and the sessions' streams stepped as
    rank 0 says (:class:`~vidgen.distributed.session_group.SessionFollower`)."""

    def __init__(self, spec: PipelineSpec, rank: int, sp: int, init_method: str, kind: str) -> None:
        import torch

        if os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        self._group_args = (rank, sp, init_method, kind)
        self.follower: Any = None
        # kept and raised by ready(): raised here, Ray would lose the exception's type
        self._init_error: Exception | None = None
        try:
            self.pipe = spec.load()
        except Exception as err:
            self._init_error = err

    def ready(self) -> int:
        if self._init_error is not None:
            raise self._init_error
        return os.getpid()

    def join(self) -> None:
        """Join rank 0's group (blocks until every rank has)."""
        from vidgen.distributed.sequence_parallel import init_process_group
        from vidgen.distributed.session_group import SessionFollower

        rank, sp, init_method, kind = self._group_args
        group = init_process_group(rank, sp, init_method, sp=sp, kind=kind)  # type: ignore[arg-type]
        self.follower = SessionFollower(self.pipe, group)

    def handle(self, command: tuple[Any, ...]) -> bool:
        return self.follower.handle(command)

    def stats(self) -> dict[str, Any]:
        """Process, chunks made, streams open, and the placement group it runs in."""
        return {
            "pid": os.getpid(),
            "steps": self.follower.steps,
            "open": len(self.follower.streams),
            "placement_group": placement_group_id(),
        }


def placement_group_id() -> str | None:
    """The id of the placement group this process runs in (None: none)."""
    import ray

    placement = ray.util.get_current_placement_group()
    return placement.id.hex() if placement is not None else None


def start_followers(pipe: Any, spec: PipelineSpec, sp: int, actor_options: dict[str, Any]):
    """``(leader, followers)``: ranks 1 .. sp - 1 started in this replica's placement bundles 1 ..
    sp - 1, one group joined with them, and the ``SessionLeader`` that steps it (rank 0 is here)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from vidgen.distributed.ray_cluster import file_init_method
    from vidgen.distributed.sequence_parallel import init_process_group
    from vidgen.distributed.session_group import SessionLeader

    kind = serving_kind(spec, sp)
    init_method = file_init_method(tempfile.mkdtemp(prefix="vidgen-sp-"))  # one node: the bundles pack
    placement = ray.util.get_current_placement_group()
    cls = ray.remote(max_restarts=0, max_task_retries=0)(SessionFollowerActor)
    followers = []
    for rank in range(1, sp):
        options = dict(actor_options)
        if placement is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=placement, placement_group_bundle_index=rank
            )
        followers.append(cls.options(**options).remote(spec, rank, sp, init_method, kind))
    try:
        ray.get([f.ready.remote() for f in followers])
        joined = [f.join.remote() for f in followers]
        group = init_process_group(0, sp, init_method, sp=sp, kind=kind)  # type: ignore[arg-type]
        ray.get(joined)
    except ray.exceptions.RayTaskError as err:
        raise err.as_instanceof_cause() from None

    def send(command: tuple[Any, ...]):
        calls = [f.handle.remote(command) for f in followers]

        def done() -> None:
            try:
                ray.get(calls)
            except ray.exceptions.RayTaskError as err:  # a follower's error, as its own type
                raise err.as_instanceof_cause() from None

        return done

    return SessionLeader(pipe, group, send), followers
