"""``vidgen render --parallel ray``: one video made by a replica of ``--sp`` Ray workers.

Who calls whom::

    vidgen.cli.render.run --> render_with_ray --> record_video --> Replica.stream --> PipelineWorker.stream
                                  (driver)            (driver)       (driver)          (Ray actors, rank 0..sp-1)

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

import argparse
import json
import shutil
import sys
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
    SequenceParallelUnavailable,
    VideoJob,
    link_atomically,
    saved_chunk_index,
    sequence_parallel_module,
    snapshots,
)
from vidgen.distributed.replica import Replica, WorkerLost

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
    job: VideoJob,
    parts: Path,
    out: Path,
    *,
    max_restarts: int = 3,
    on_chunk: Callable[[Any], None] | None = None,
    on_restart: Callable[[Replica, Exception], None] | None = None,
    upscale: Any = None,
) -> RecordResult:
    """Make ``job`` on ``replica`` into the recording ``parts`` and join it to ``out``.

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
            for chunk in replica.stream(job, parts / WORK_DIR, start_states, skip_through):
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


def spec_from_args(args: argparse.Namespace) -> PipelineSpec:
    """The pipeline every worker loads, with the overrides ``vidgen render`` would apply."""
    from vidgen.cli.render import lora_overrides, parse_overrides

    overrides: dict[str, Any] = parse_overrides(args.set)
    if getattr(args, "fps", None):
        overrides["generation.fps"] = args.fps
    if getattr(args, "transformer", None):
        overrides["model.transformer"] = args.transformer
    overrides.update(lora_overrides(args))
    if getattr(args, "quantize", None):
        overrides["runtime.quantize"] = args.quantize
    if getattr(args, "sp_kind", None):
        overrides["runtime.sp_kind"] = args.sp_kind
    return PipelineSpec(model=args.model, config=args.config, overrides=overrides)


def start_of(image: str | None, video: str | None) -> dict[str, Any]:
    """VideoJob fields for ``--image`` / ``--continue`` (absolute paths: workers may run elsewhere)."""
    if not (image or video):
        return {}
    absolute = {k: str(Path(v).resolve()) for k, v in (("image", image), ("video", video)) if v}
    return {**absolute, "include_input": True}


def _start_paths(args: argparse.Namespace) -> tuple[str | None, str | None]:
    return getattr(args, "image", None), getattr(args, "continue_from", None)


def check_layout(sp: int, replicas: int) -> RayParallelism:
    """Degrees checked before Ray starts: positive, and sp > 1 only with the SP module present."""
    layout = RayParallelism(sp=sp, replicas=replicas)
    if layout.sp > 1:
        sequence_parallel_module()
    return layout


def user_errors() -> tuple[type[Exception], ...]:
    """Exceptions that are the user's to fix (printed as one line by the CLI)."""
    from vidgen.config import ConfigError
    from vidgen.pipelines import InputError, ModelLoadError

    return (InputError, ConfigError, ModelLoadError, DegreeError, SequenceParallelUnavailable)


def user_message(err: Exception) -> str:
    """The message of a user error, without the remote traceback Ray puts around one raised in a
    worker (``RayTaskError.as_instanceof_cause`` keeps the original as ``cause``)."""
    return str(getattr(err, "cause", None) or err)


def render_with_ray(args: argparse.Namespace, request: dict, seed: int, parts: Path, out: Path) -> int:
    """``vidgen render --parallel ray``: the request (already recorded in ``parts``) on one replica."""
    from vidgen.cli import UsageError
    from vidgen.cli.render import _Progress

    replicas = getattr(args, "replicas", 1) or 1
    try:
        if replicas != 1:
            raise DegreeError("--replicas applies to batches (--jobs FILE.jsonl); one video uses one replica")
        if getattr(args, "decode_worker", False) and start_of(*_start_paths(args)):
            raise DegreeError(
                "--image / --continue need the frames decoded by the ranks: drop --decode-worker"
            )
        layout = check_layout(args.sp, 1)
    except user_errors() as err:
        raise UsageError(str(err)) from None
    job = VideoJob(
        prompt=args.prompt,
        storyboard=request["storyboard"],
        seconds=args.seconds,
        height=args.height,
        width=args.width,
        num_inference_steps=args.steps,
        guidance_scale=args.guidance,
        seed=seed,
        **start_of(*_start_paths(args)),
    )
    started = connect(getattr(args, "address", None))
    placement = replica = None
    try:
        decode_worker = bool(getattr(args, "decode_worker", False))
        placement = place_workers(layout, extra=int(decode_worker))
        replica = Replica(
            0,
            spec_from_args(args),
            placement,
            layout.sp,
            parts / WORK_DIR,
            loopback=is_loopback_cluster(),
            decode_bundle=layout.world if decode_worker else None,
        )
        replica.start()
        fps = replica.fps
        job.num_frames = round(args.seconds * fps)
        if not args.quiet:
            unit = "GPU" if placement.gpu else "CPU"
            decoding = " + a decode worker" if decode_worker else ""
            print(
                f"vidgen render: seed {seed}, {args.seconds:g} s at {fps} fps -> {out} "
                f"(Ray {started}, sp {layout.sp} on {layout.world} {unit} worker(s){decoding})",
                file=sys.stderr,
            )
        from vidgen.video import SegmentedRecording, Upscale

        upscale = Upscale(getattr(args, "upscale", 1), getattr(args, "resample", "nearest"))
        if not (parts / "request.json").is_file():
            parts.mkdir(parents=True, exist_ok=True)
            (parts / "request.json").write_text(json.dumps({**request, "seed": seed}))
        initial = SegmentedRecording(parts, fps=fps, upscale=upscale).num_frames()
        progress = _Progress(job.num_frames, fps, initial, quiet=args.quiet)
        rate = _RealTime(fps)
        try:
            result = record_video(
                replica,
                job,
                parts,
                out,
                on_chunk=lambda c: progress.update(len(c.frames), rate.add(len(c.frames))),
                on_restart=lambda r, err: print(f"\nvidgen render: {err}; restarting", file=sys.stderr),
                upscale=upscale,
            )
        finally:
            progress.close()
    except user_errors() as err:
        if not _recorded_any(parts):
            shutil.rmtree(parts, ignore_errors=True)
        raise UsageError(user_message(err)) from None
    except WorkerLost as err:
        raise UsageError(f"{err}; the render can be continued with --resume") from None
    finally:
        if replica is not None:
            replica.stop()
        if placement is not None:
            placement.remove()
        if started == "local":
            import ray

            ray.shutdown()
    if not args.quiet:
        extra = f", {result.restarts} worker restart(s)" if result.restarts else ""
        print(f"vidgen render: wrote {out} ({result.frames} frames{extra})", file=sys.stderr)
    return 0


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
