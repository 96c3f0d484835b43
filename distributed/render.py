"""One video made by a replica of ``sp`` Ray workers (``vidgen render --parallel ray``).

Who calls whom::

    render_on_ray --> record_video --> Replica.stream --> PipelineWorker.stream
       (driver)          (driver)         (driver)          (Ray actors, rank 0..sp-1)

``vidgen render --parallel ray`` translates its arguments into a call of :func:`render_on_ray`.

The driver alone writes the recording (``OUT.parts/``, the same resumable folder as the
single-process render): a chunk is appended to the recording, then the state saved after that
chunk is published as ``OUT.parts/state.safetensors``. So the folder always holds a state that
matches its last recorded chunk, a worker that dies is replaced and continues from there, and an
interrupted render can be finished with ``--resume``, with or without Ray.

``--decode-worker`` (disaggregated decode): one more worker holds only the VAE. The ranks send each
chunk's latents instead of frames and go on denoising the next chunk while that worker decodes it
(``Replica.stream`` keeps the chunks in order). Its decoder state is snapshotted per chunk next to
the ranks' states, so either side can die and the video still resumes seamlessly.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vidgen.distributed.ray_cluster import (
    DegreeError,
    RayParallelism,
    connect,
    is_loopback_cluster,
    place_workers,
)
from vidgen.distributed.ray_worker import (
    WORK_DIR,
    PipelineSpec,
    link_atomically,
    saved_chunk_index,
    snapshots,
)
from vidgen.distributed.replica import Replica, WorkerLost
from vidgen.request import GenerationRequest, random_seed, render_record
from vidgen.validation import InputError

STATE_FILE = "state.safetensors"
"""The published state in a ``.parts`` folder (the name the single-process render uses)."""


@dataclass
class RecordResult:
    frames: int
    chunks: int
    restarts: int


def resume_point(
    parts: Path, last_recorded: int, ranks: int = 1, decoder: bool = False
) -> tuple[list[str] | None, int]:
    """The states to start from (one per rank, then the decode worker's) and the last chunk not to
    yield again.

    The newest state saved at or before ``last_recorded``: a worker's snapshot, or the published
    ``state.safetensors`` (which a single-process render may have left). The chunks between it and
    ``last_recorded`` are made again but not recorded twice; with no state at all, the video is
    made again from the start.
    """
    if last_recorded < 0:
        return None, -1
    found = snapshots(parts / WORK_DIR, ranks, decoder)
    usable = {i: [str(p) for p in paths] for i, paths in found.items()}
    published = saved_chunk_index(parts / STATE_FILE) if (parts / STATE_FILE).is_file() else None
    if ranks == 1 and not decoder and published is not None:
        usable.setdefault(published, [str(parts / STATE_FILE)])
    best = max((i for i in usable if i <= last_recorded), default=None)
    return (usable[best] if best is not None else None), last_recorded


def _publish_state(parts: Path, last_recorded: int, ranks: int, decoder: bool) -> None:
    """Point ``state.safetensors`` at the newest snapshot covered by the recording (for a
    single-process ``--resume``; sp = 1 without a decode worker only: otherwise the state is in
    several files) and drop the snapshots older than it."""
    found = snapshots(parts / WORK_DIR, ranks, decoder)
    newest = max((i for i in found if i <= last_recorded), default=None)
    if newest is None:
        return
    if ranks == 1 and not decoder:
        link_atomically(found[newest][0], parts / STATE_FILE)
    for index, paths in found.items():
        if index < newest:
            for path in paths:
                path.unlink(missing_ok=True)


def record_video(
    replica: Replica,
    request: GenerationRequest,
    parts: Path,
    out: Path,
    *,
    max_restarts: int = 3,
    on_chunk: Callable[[Any], None] | None = None,
    on_restart: Callable[[Replica, Exception], None] | None = None,
    upscale: Any = None,
) -> RecordResult:
    """Make ``request`` (its seed set) on ``replica`` into the recording ``parts`` and join it to ``out``.

    A :class:`WorkerLost` restarts the replica and continues after the last recorded chunk (at
    most ``max_restarts`` times). Chunks already recorded are never recorded again. ``upscale``:
    a factor or :class:`vidgen.video.Upscale` for the recorded frames.
    """
    from vidgen.video import SegmentedRecording

    recording = SegmentedRecording(parts, fps=replica.fps, upscale=upscale)
    restarts = 0
    while True:
        done = recording.completed_chunks()
        last = done[-1] if done else -1
        split = replica.decoder is not None
        start_states, skip_through = resume_point(parts, last, replica.sp, split)
        try:
            for chunk in replica.stream(request, parts / WORK_DIR, start_states, skip_through):
                if chunk.index <= last:
                    continue
                recording.append(chunk.index, chunk.frames)
                last = chunk.index
                _publish_state(parts, last, replica.sp, split)
                if on_chunk is not None:
                    on_chunk(chunk)
            break
        except WorkerLost as err:
            restarts += 1
            if restarts > max_restarts:
                raise
            if on_restart is not None:
                on_restart(replica, err)
            replica.restart()
    recording.finalize(out)
    frames = recording.num_frames()
    chunks = len(recording.completed_chunks())
    shutil.rmtree(parts, ignore_errors=True)
    return RecordResult(frames=frames, chunks=chunks, restarts=restarts)


def check_layout(sp: int, replicas: int) -> RayParallelism:
    """Degrees checked before Ray starts: positive whole numbers."""
    return RayParallelism(sp=sp, replicas=replicas)


def unwrapped(err: InputError) -> InputError:
    """A user error without the remote traceback Ray puts around one raised in a worker
    (``RayTaskError.as_instanceof_cause`` keeps the original as ``cause``)."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, InputError) else err


@dataclass
class RayRenderStart:
    """What :func:`render_on_ray` reports once its workers are up (``on_start``)."""

    cluster: str
    """What :func:`~vidgen.distributed.ray_cluster.connect` joined (an address, ``local``, ``existing``)."""
    fps: int
    num_frames: int
    """Frames the video will have (a start clip's frames not counted)."""
    recorded_frames: int
    """Frames an interrupted render already recorded (they are not made again)."""
    layout: RayParallelism
    gpu: bool
    decode_worker: bool


def render_on_ray(
    request: GenerationRequest,
    out: str | Path,
    *,
    spec: PipelineSpec | None = None,
    sp: int = 1,
    decode_worker: bool = False,
    address: str | None = None,
    upscale: Any = None,
    record: dict[str, Any] | None = None,
    on_start: Callable[[RayRenderStart], None] | None = None,
    on_chunk: Callable[[Any, float], None] | None = None,
    on_restart: Callable[[Exception], None] | None = None,
    max_restarts: int = 3,
) -> RecordResult:
    """Render ``request`` on one replica of ``sp`` Ray workers into the MP4 ``out``.

    The video is recorded in ``OUT.parts/`` as it is made (a render found there is continued, so
    an interrupted one is finished by calling this again); ``record`` is what that folder's
    ``request.json`` records (:func:`~vidgen.request.render_record`, for a later ``--resume`` to
    compare; default: the request alone). A request without a seed gets a random one; its start
    file is read by the workers by its absolute path. ``spec``: the pipeline every worker loads
    (default: the embedded model). ``decode_worker``: one more worker decodes while
    the ranks denoise the next chunk. ``address``: the cluster to join (default ``RAY_ADDRESS``,
    else a local one, shut down at the end). ``on_chunk(chunk, real_time_factor)`` is called for
    every chunk recorded, ``on_restart(error)`` when a lost worker is replaced.

    A request that cannot run raises :class:`~vidgen.validation.InputError` (a bad degree, a model
    that does not load, a request the pipeline refuses) and leaves no ``.parts`` folder behind if
    nothing was recorded; :class:`WorkerLost` after ``max_restarts`` replacements.
    """
    out = Path(out)
    parts = out.with_name(out.name + ".parts")
    request = request.validate().with_absolute_paths()
    if request.seed is None:  # every rank, and a restarted one, must draw the same noise
        request = dataclasses.replace(request, seed=random_seed())
    if decode_worker and request.start is not None:
        raise DegreeError("--image / --continue need the frames decoded by the ranks: drop --decode-worker")
    layout = check_layout(sp, 1)
    started = connect(address)
    placement = replica = None
    try:
        placement = place_workers(layout, extra=int(decode_worker))
        replica = Replica(
            0,
            spec or PipelineSpec(),
            placement,
            layout.sp,
            parts / WORK_DIR,
            loopback=is_loopback_cluster(),
            decode_bundle=layout.world if decode_worker else None,
        )
        replica.start()
        fps = replica.fps
        from vidgen.video import SegmentedRecording

        if not (parts / "request.json").is_file():
            parts.mkdir(parents=True, exist_ok=True)
            saved = record if record is not None else render_record(request)
            (parts / "request.json").write_text(json.dumps(saved))
        recorded = SegmentedRecording(parts, fps=fps, upscale=upscale).num_frames()
        if on_start is not None:
            frames = request.num_frames(request.fps or fps) or 0
            on_start(RayRenderStart(started, fps, frames, recorded, layout, placement.gpu, decode_worker))
        rate = _RealTime(fps)
        return record_video(
            replica,
            request,
            parts,
            out,
            max_restarts=max_restarts,
            on_chunk=None if on_chunk is None else lambda c: on_chunk(c, rate.add(len(c.frames))),
            on_restart=None if on_restart is None else lambda r, err: on_restart(err),
            upscale=upscale,
        )
    except InputError as err:
        if not _recorded_any(parts):
            shutil.rmtree(parts, ignore_errors=True)
        raise unwrapped(err) from None
    finally:
        if replica is not None:
            replica.stop()
        if placement is not None:
            placement.remove()
        if started == "local":
            import ray

            ray.shutdown()


class _RealTime:
    """Video seconds recorded per wall second since the start (the driver's view, which also
    holds when chunks are decoded away from the ranks)."""

    def __init__(self, fps: int) -> None:
        import time

        self.clock = time.perf_counter
        self.fps, self.frames, self.started = fps, 0, self.clock()

    def add(self, frames: int) -> float:
        self.frames += frames
        return self.frames / self.fps / max(self.clock() - self.started, 1e-9)


def _recorded_any(parts: Path) -> bool:
    try:
        return bool(json.loads((parts / "manifest.json").read_text())["chunks"])
    except (OSError, ValueError, KeyError):
        return False
