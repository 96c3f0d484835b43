"""A replica: the ``sp`` Ray workers that make one video together, and the stream of its chunks.

The driver owns replicas. :meth:`Replica.stream` starts the job on every rank and yields rank 0's
chunks; if any rank's process dies it raises :class:`WorkerLost`, and :meth:`Replica.restart`
replaces all ranks (a torch.distributed group cannot take a new member, so it is formed again from
a fresh rendezvous) in the same placement bundles. An error raised by the pipeline itself (a bad
request) propagates as the pipeline's own exception type.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vidgen.distributed.ray_cluster import WorkerPlacement, file_init_method
from vidgen.distributed.ray_worker import PipelineSpec, VideoJob, worker_class, worker_env

BACKPRESSURE_CHUNKS = 2
"""Chunks a worker may run ahead of the driver (bounds memory and wasted work after a failure)."""


class WorkerLost(RuntimeError):
    """A worker process died (killed, crashed, its node lost) while making a video."""


class Replica:
    """``sp`` workers in bundles ``first_bundle .. first_bundle + sp - 1`` of ``placement``."""

    def __init__(
        self,
        index: int,
        spec: PipelineSpec,
        placement: WorkerPlacement,
        sp: int,
        rendezvous_dir: str | Path,
        *,
        loopback: bool,
    ) -> None:
        self.index = index
        self.spec = spec
        self.placement = placement
        self.sp = sp
        self.rendezvous_dir = Path(rendezvous_dir)
        self.loopback = loopback
        self.workers: list[Any] = []
        self.info: list[dict[str, Any]] = []
        self.restarts = 0

    @property
    def pids(self) -> list[int]:
        return [info["pid"] for info in self.info]

    @property
    def fps(self) -> int:
        return self.info[0]["fps"]

    def start(self) -> Replica:
        import ray

        cls = worker_class(self.placement.gpu, worker_env(self.loopback))
        init_method = file_init_method(self.rendezvous_dir) if self.sp > 1 else None
        first = self.index * self.sp
        self.workers = [
            cls.options(**self.placement.actor_options(first + rank)).remote(
                self.spec, rank, self.sp, init_method
            )
            for rank in range(self.sp)
        ]
        try:
            self.info = ray.get([w.ready.remote() for w in self.workers])
        except ray.exceptions.RayActorError as err:
            raise WorkerLost(f"replica {self.index}: a worker died while starting: {err}") from err
        except ray.exceptions.RayTaskError as err:
            raise err.as_instanceof_cause() from None
        return self

    def stop(self) -> None:
        import ray

        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        self.workers, self.info = [], []

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start()

    def stream(
        self, job: VideoJob, work_dir: str | Path, start_states: list[str] | None, skip_through: int
    ) -> Iterator[Any]:
        """Rank 0's chunks of ``job``; every rank runs it (see ``PipelineWorker.stream``)."""
        import ray

        streams = [
            w.stream.options(_generator_backpressure_num_objects=BACKPRESSURE_CHUNKS).remote(
                job, str(work_dir), start_states, skip_through
            )
            for w in self.workers
        ]
        leader = streams[0]
        pending = list(streams)
        while pending:
            # a generator is ready when its next chunk is, when it ends, or when its worker dies
            ready, _ = ray.wait(pending, num_returns=1)
            for stream in ready:
                try:
                    ref = next(stream)
                except StopIteration:
                    pending.remove(stream)
                    continue
                try:
                    value = ray.get(ref)
                except ray.exceptions.RayTaskError as err:
                    raise err.as_instanceof_cause() from None
                except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as err:
                    raise WorkerLost(
                        f"replica {self.index}: a worker died mid-video ({type(err).__name__})"
                    ) from err
                if stream is leader:
                    yield value
