"""Starting or joining a Ray cluster, checking it is big enough, and placing workers on it.

Ray is one executor backend of vidgen: it is imported inside these functions only, never when
``vidgen.distributed`` is imported. :func:`connect` joins the cluster named by ``--address`` or
``RAY_ADDRESS``; with neither it starts a private single-node instance bound to 127.0.0.1 with no
dashboard (nothing is reachable from another machine). :func:`place_workers` reserves one bundle per
worker (a GPU each when the cluster has GPUs, a CPU slot each otherwise) in a placement group, so a
job either gets all of its ranks or waits, and a replaced worker lands in the bundle it left.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vidgen.validation import InputError

LOOPBACK = "127.0.0.1"


class DegreeError(InputError):
    """Parallel degrees that cannot run (or cannot run on this cluster); the message says what to change."""


@dataclass(frozen=True)
class RayParallelism:
    """How a Ray run is laid out: ``replicas`` independent copies of the pipeline, each spread
    over ``sp`` sequence-parallel ranks; ``sp * replicas`` workers (GPUs) in all."""

    sp: int = 1
    """Sequence-parallel degree: ranks (GPUs) that share one video's tokens."""
    replicas: int = 1
    """Independent pipeline copies, each making its own videos (data parallelism)."""

    def __post_init__(self) -> None:
        for name in ("sp", "replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DegreeError(f"--{name} must be a positive integer, got {value!r}")

    @property
    def world(self) -> int:
        return self.sp * self.replicas

    def check_fits(self, slots: int, unit: str) -> None:
        """``slots``: GPUs (or CPU slots) the cluster offers."""
        if self.world > slots:
            raise DegreeError(
                f"--sp {self.sp} x --replicas {self.replicas} needs {self.world} {unit}s but the Ray "
                f"cluster has {slots}: lower --sp or --replicas, or add nodes (ray start --address=HEAD:6379)"
            )


def connect(address: str | None = None, *, num_cpus: int | None = None, quiet: bool = True) -> str:
    """Join the Ray cluster at ``address`` (else ``RAY_ADDRESS``), or start a local loopback one.

    Returns the address joined, ``"local"`` for a new local instance (the caller shuts it down), or
    ``"existing"`` when Ray is already initialised in this process (a test fixture, a notebook).
    ``num_cpus`` only sizes a local instance.
    """
    address = address or os.environ.get("RAY_ADDRESS") or None
    if not address:
        loopback_only()
    import ray

    if ray.is_initialized():
        return "existing"
    options: dict[str, Any] = {"log_to_driver": not quiet, "logging_level": "WARNING"}
    if address:
        check_reachable(address)
        ray.init(address=address, **options)
        return address
    ray.init(_node_ip_address=LOOPBACK, include_dashboard=False, num_cpus=num_cpus, **options)
    return "local"


def check_reachable(address: str, timeout: float = 3.0) -> None:
    """:class:`InputError` within ``timeout`` seconds when nothing accepts a connection at a
    ``HOST:PORT`` (or ``ray://HOST:PORT``) address; Ray itself retries for minutes before it says
    so. ``auto`` and addresses without a port are left to Ray."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as err:
        raise InputError(
            f"--address {address}: nothing answers there ({err.strerror or 'timed out'}): start the Ray "
            "head node there (ray start --head) or leave --address out for a local cluster"
        ) from None


def loopback_only() -> None:
    """Make a local Ray instance bind 127.0.0.1 only.

    ``_node_ip_address`` alone is not enough: unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, Ray's
    agents and servers also listen on the machine's other addresses. Ray reads the variable when it
    is imported, so it is set here before the import (and Ray's copy corrected if it was imported
    already); the processes Ray starts inherit it.
    """
    import sys

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None and os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0":
        constants.ENABLE_RAY_CLUSTER = False


def uses_gpus() -> bool:
    """Whether workers should each take a GPU: the cluster has GPUs."""
    import ray

    return ray.cluster_resources().get("GPU", 0) >= 1


def worker_slots(gpu: bool) -> int:
    """GPUs, or whole CPUs, in the cluster (each worker takes one)."""
    import ray

    return int(ray.cluster_resources().get("GPU" if gpu else "CPU", 0))


def is_loopback_cluster() -> bool:
    """True when this Ray node is bound to 127.0.0.1 (the private local instance)."""
    import ray

    return ray.util.get_node_ip_address() == LOOPBACK


@dataclass
class WorkerPlacement:
    """A placement group with one bundle per worker; :meth:`strategy` pins an actor to bundle ``i``."""

    group: Any
    gpu: bool
    bundles: int

    def strategy(self, index: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=index
        )

    def actor_options(self, index: int) -> dict[str, Any]:
        """Resources and placement for the worker in bundle ``index``."""
        return {
            "num_cpus": 1,
            "num_gpus": 1 if self.gpu else 0,
            "scheduling_strategy": self.strategy(index),
        }

    def remove(self) -> None:
        from ray.util import remove_placement_group

        remove_placement_group(self.group)


def place_workers(
    layout: RayParallelism, *, gpu: bool | None = None, extra: int = 0, timeout_s: float = 120.0
) -> WorkerPlacement:
    """Reserve ``layout.world`` bundles (plus ``extra``, e.g. a decode worker, after them); the
    ``sp`` ranks of a replica are consecutive bundles.

    ``PACK`` keeps ranks on as few nodes as possible (sequence parallelism talks every layer, so its
    ranks want NVLink, not the network). Raises :class:`DegreeError` when the cluster is too small
    and ``TimeoutError`` when the resources exist but stay busy.
    """
    import ray
    from ray.util import placement_group, remove_placement_group

    gpu = uses_gpus() if gpu is None else gpu
    unit = "GPU" if gpu else "CPU"
    count = layout.world + extra
    if count > worker_slots(gpu):
        layout.check_fits(worker_slots(gpu), unit)
        raise DegreeError(
            f"{layout.world} workers and {extra} decode worker(s) need {count} {unit}s but the Ray "
            f"cluster has {worker_slots(gpu)}: drop --decode-worker or lower --sp / --replicas"
        )
    bundle = {"CPU": 1, "GPU": 1} if gpu else {"CPU": 1}
    group = placement_group([dict(bundle) for _ in range(count)], strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise TimeoutError(
            f"Ray could not reserve {count} {unit} bundles within {timeout_s:g} s "
            "(other jobs hold them?); see `ray status`"
        )
    return WorkerPlacement(group, gpu, count)


def rendezvous_dir() -> Path:
    """Where ``file://`` rendezvous files go: ``VIDGEN_RENDEZVOUS_DIR`` (shared storage, for ranks on
    several nodes), else the system temp folder (one node)."""
    import tempfile

    return Path(os.environ.get("VIDGEN_RENDEZVOUS_DIR") or Path(tempfile.gettempdir()) / "vidgen-rendezvous")


def file_init_method(folder: str | os.PathLike) -> str:
    """A fresh ``file://`` rendezvous for torch.distributed (no TCP port is opened for it).

    The folder must be visible to every rank: any local folder on one node, shared storage across
    nodes.
    """
    path = Path(folder).resolve() / f"rendezvous-{uuid.uuid4().hex}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"file://{path}"
