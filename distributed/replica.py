"""A replica: the ``sp`` Ray workers that make one video together, and the stream of its chunks.

The driver owns replicas. :meth:`Replica.stream` starts the job on every rank and yields rank 0's
chunks; if any rank's process dies it raises :class:`WorkerLost`, and :meth:`Replica.restart`
replaces all ranks (a torch.distributed group cannot take a new member, so it is formed again from
a fresh rendezvous) in the same placement bundles. An error raised by the pipeline itself (a bad
request) propagates as the pipeline's own exception type.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vidgen.distributed.ray_cluster import WorkerPlacement, file_init_method
from vidgen.distributed.ray_worker import PipelineSpec, worker_class, worker_env
from vidgen.request import GenerationRequest

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
        decode_bundle: int | None = None,
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
        self.decode_bundle = decode_bundle
        """Placement bundle of a separate decode worker (None: the ranks decode their chunks)."""
        self.decoder: Any = None

    @property
    def pids(self) -> list[int]:
        """Process ids of the ranks (then of the decode worker, if any)."""
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
        if self.decode_bundle is not None:
            from vidgen.distributed.ray_worker import DecodeWorker

            decoder_cls = worker_class(self.placement.gpu, worker_env(self.loopback), cls=DecodeWorker)
            self.decoder = decoder_cls.options(**self.placement.actor_options(self.decode_bundle)).remote(
                self.spec
            )
        try:
            self.info = ray.get([w.ready.remote() for w in self.all_actors])
        except ray.exceptions.RayActorError as err:
            raise WorkerLost(f"replica {self.index}: a worker died while starting: {err}") from err
        except ray.exceptions.RayTaskError as err:
            raise err.as_instanceof_cause() from None
        return self

    @property
    def all_actors(self) -> list[Any]:
        return self.workers + ([self.decoder] if self.decoder is not None else [])

    def stop(self) -> None:
        import ray

        for actor in self.all_actors:
            ray.kill(actor, no_restart=True)
        self.workers, self.info, self.decoder = [], [], None

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start()

    def stream(
        self,
        request: GenerationRequest,
        work_dir: str | Path,
        start_states: list[str] | None,
        skip_through: int,
    ) -> Iterator[Any]:
        """Rank 0's chunks of ``request`` after ``skip_through`` (see ``PipelineWorker.stream``).

        ``start_states``: one per rank, then the decode worker's when there is one. With a decode
        worker the ranks send latents; each chunk is decoded there while the ranks make the next,
        and chunks come out in order with their frames.
        """
        import ray

        split = self.decoder is not None
        if split:
            ray.get(self.decoder.start.remote(str(work_dir), start_states[-1] if start_states else None))
            start_states = start_states[:-1] if start_states else None
        streams = [
            w.stream.options(_generator_backpressure_num_objects=BACKPRESSURE_CHUNKS).remote(
                request, str(work_dir), start_states, -1 if split else skip_through, not split
            )
            for w in self.workers
        ]
        leader = streams[0]
        num_frames = request.num_frames(request.fps or self.fps)
        pending: list[Any] = list(streams)
        decoding: collections.deque[tuple[Any, Any]] = collections.deque()  # (chunk, frames ref), in order
        while pending or decoding:
            # ready: a rank's next chunk, its end or its death; or the oldest chunk's frames. With
            # BACKPRESSURE_CHUNKS chunks waiting for the decoder, rank 0 is not read (so it waits).
            full = len(decoding) >= BACKPRESSURE_CHUNKS
            waiting = [s for s in pending if not (full and s is leader)] + (
                [decoding[0][1]] if decoding else []
            )
            ready, _ = ray.wait(waiting, num_returns=1)
            for item in ready:
                if isinstance(item, ray.ObjectRef):
                    chunk, ref = decoding.popleft()
                    chunk.frames, chunk.metrics.decode_seconds = self._get(ref)
                    chunk.latents = None
                    if chunk.index > skip_through:
                        yield chunk
                    continue
                try:
                    ref = next(item)
                except StopIteration:
                    pending.remove(item)
                    continue
                value = self._get(ref)
                if item is not leader:
                    continue
                if not split:
                    yield value
                    continue
                chunk, latent_start = value
                keep = num_frames - chunk.frame_start if num_frames is not None else None
                decoding.append(
                    (chunk, self.decoder.decode.remote(chunk.latents, latent_start, chunk.index, keep))
                )

    def _get(self, ref) -> Any:
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as err:
            raise err.as_instanceof_cause() from None
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as err:
            raise WorkerLost(f"replica {self.index}: a worker died mid-video ({type(err).__name__})") from err
