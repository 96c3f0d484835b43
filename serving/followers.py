"""Sequence parallelism for a Serve replica: the replica is rank 0, ``sp - 1`` follower actors the rest.

A replica started with ``sp > 1`` (``vidgen serve --backend ray --sp N``) loads the pipeline, starts
one :class:`SessionFollowerActor` per other rank in the bundles of its own placement group (Serve
reserves ``sp`` bundles on one node for each replica, see ``deployment``), and all of them join
one torch.distributed group (gloo on CPU, nccl on GPU) through a ``file://`` rendezvous on that
node. The replica's ``SessionManager`` then runs every session's stream through a
:class:`~vidgen.distributed.session_group.SessionLeader`, whose commands reach the followers as
actor calls (:class:`ReplicaGroup`): a follower waits for Ray, not inside a collective, while the
replica has nothing to do. The followers are the replica's actors: they die with it; a follower
that dies alone breaks the group, and the replica then fails Serve's health check
(:meth:`ReplicaGroup.check`) and is replaced.

:func:`group_kind` decides Ulysses or ring (``runtime.sp_kind``); :func:`check_serving_degree`
checks the degree from the model folder's ``config.json`` before anything starts, so a degree the
model cannot split is one line from ``vidgen serve``, not a replica that fails to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vidgen.distributed.ray_worker import PipelineSpec
from vidgen.distributed.session_group import Command, GroupLost, Send, SessionLeader


def group_kind(sp_kind: str, transformer_config: Any, sp: int) -> str:
    """``"ulysses"`` or ``"ring"`` (``runtime.sp_kind``) for ``sp`` ranks of a transformer with this
    config (an object or a ``config.json`` dict), or :class:`~vidgen.distributed.ray_cluster.DegreeError`
    saying what to change."""
    from vidgen.distributed.ray_cluster import DegreeError
    from vidgen.distributed.sequence_parallel import resolve_kind, validate_degrees

    heads = (
        transformer_config["num_attention_heads"]
        if isinstance(transformer_config, dict)
        else transformer_config.num_attention_heads
    )
    try:
        kind = resolve_kind(sp_kind, int(heads), sp)
        validate_degrees(transformer_config, sp, 1, sp, kind=kind)
    except ValueError as err:
        raise DegreeError(f"--sp {sp}: {err}") from None
    return kind


def check_serving_degree(spec: PipelineSpec, sp: int) -> None:
    """:func:`group_kind` from the model folder's config files (no weights), before any replica
    starts; a folder without ``transformer/config.json`` is left to the replicas to check."""
    from vidgen.config import load_config
    from vidgen.pipelines.loading import resolve_model

    folder, config = resolve_model(spec.model, load_config(spec.config) if spec.config else None)
    if spec.overrides:
        config = config.replace(**spec.overrides)
    try:
        transformer = json.loads((Path(folder) / "transformer" / "config.json").read_text())
    except (OSError, ValueError):
        return
    group_kind(config.runtime.sp_kind, transformer, sp)


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


@dataclass(frozen=True)
class GroupSettings:
    """How a Serve replica forms its sequence-parallel group (given to every replica)."""

    sp: int
    """Ranks: the replica and ``sp - 1`` followers."""
    actor_options: dict[str, Any]
    """Ray options of a follower (its CPUs or GPU, runtime env); its bundle is added here."""
    rendezvous_root: str | None = None
    """Folder the groups' rendezvous folders are made in (None: the system's temporary folder);
    the deployment's owner removes it when it takes the deployment down."""


@dataclass
class ReplicaGroup:
    """A Serve replica's sequence-parallel group: rank 0 (this process) leads, ``followers`` are
    the actors of ranks 1 .. sp - 1."""

    leader: SessionLeader
    """The replica's ``SessionManager`` streamer."""
    followers: list[Any]
    rendezvous: Path
    """The folder of the group's ``file://`` rendezvous (removed by :meth:`close`)."""

    @classmethod
    def start(cls, pipe: Any, spec: PipelineSpec, settings: GroupSettings) -> ReplicaGroup:
        """Start ranks 1 .. sp - 1 in this replica's placement bundles 1 .. sp - 1 and form the
        group with them (rank 0 is this process, with ``pipe`` loaded)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from vidgen.distributed.ray_cluster import file_init_method
        from vidgen.distributed.sequence_parallel import init_process_group

        sp = settings.sp
        kind = group_kind(pipe.config.runtime.sp_kind, pipe.transformer.config, sp)
        if settings.rendezvous_root is not None:
            os.makedirs(settings.rendezvous_root, exist_ok=True)
        # on this node, which the bundles share (STRICT_PACK)
        rendezvous = Path(tempfile.mkdtemp(prefix="vidgen-sp-", dir=settings.rendezvous_root))
        init_method = file_init_method(rendezvous)
        placement = ray.util.get_current_placement_group()
        actor = ray.remote(max_restarts=0, max_task_retries=0)(SessionFollowerActor)
        followers = []
        for rank in range(1, sp):
            options = dict(settings.actor_options)
            if placement is not None:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=placement, placement_group_bundle_index=rank
                )
            followers.append(actor.options(**options).remote(spec, rank, sp, init_method, kind))
        try:
            ray.get([f.ready.remote() for f in followers])
            joined = [f.join.remote() for f in followers]
            group = init_process_group(0, sp, init_method, sp=sp, kind=kind)  # type: ignore[arg-type]
            ray.get(joined)
        except ray.exceptions.RayTaskError as err:
            raise err.as_instanceof_cause() from None
        return cls(SessionLeader(pipe, group, _actor_calls(followers)), followers, rendezvous)

    async def check(self, timeout_s: float = 1.0) -> None:
        """Raise :class:`GroupLost` if the group is broken: a step found a follower gone, or a
        follower's process is gone now. One busy making a chunk does not answer within
        ``timeout_s`` and counts as alive (a dead one's call fails at once)."""
        import ray

        if self.leader.lost is not None:
            raise self.leader.lost
        probes = [asyncio.ensure_future(_error_of(f.ready.remote())) for f in self.followers]
        done, pending = await asyncio.wait(probes, timeout=timeout_s)
        for probe in pending:
            probe.cancel()
        for probe in done:
            err = probe.result()
            if isinstance(err, ray.exceptions.RayActorError):
                raise GroupLost(_lost(err))

    async def stats(self) -> dict[str, Any]:
        """The group's kind and placement group, and each follower's own stats."""
        return {
            "sp_kind": self.leader.group.kind,
            "placement_group": placement_group_id(),
            "followers": await asyncio.gather(*(f.stats.remote() for f in self.followers)),
        }

    def close(self) -> None:
        """End the followers' streams (they die with the replica) and remove the rendezvous."""
        with contextlib.suppress(Exception):  # the followers may be gone already
            self.leader.shutdown()
        shutil.rmtree(self.rendezvous, ignore_errors=True)


def _actor_calls(followers: list[Any]) -> Send:
    """The leader's ``send``: each command as an actor call to every follower (a Ray actor runs
    one caller's calls in order)."""
    import ray

    def send(command: Command):
        calls = [f.handle.remote(command) for f in followers]

        def done() -> None:
            try:
                ray.get(calls)
            except ray.exceptions.RayTaskError as err:  # a follower's error, as its own type
                raise err.as_instanceof_cause() from None
            except ray.exceptions.RayActorError as err:
                raise GroupLost(_lost(err)) from None

        return done

    return send


def _lost(err: Exception) -> str:
    return (
        f"a follower rank of this Serve replica died ({type(err).__name__}): the replica cannot make "
        "chunks any more and fails its health check, so Serve replaces it; persisted sessions "
        "continue on the new one"
    )


async def _error_of(ref: Any) -> Exception | None:
    try:
        await ref
    except Exception as err:
        return err
    return None
