"""``vidgen render --parallel ray``: the render's arguments translated into the Ray API
(:func:`~vidgen.distributed.render.render_on_ray` for one video,
:func:`~vidgen.distributed.batch.render_batch_on_ray` for ``--jobs``), with their progress bars."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vidgen.cli.render import Progress, overrides_of, render_settings, request_of
from vidgen.request import GenerationRequest
from vidgen.validation import InputError

if TYPE_CHECKING:  # pragma: no cover
    from vidgen.distributed.batch import BatchEvent, BatchJob


def pipeline_spec(args: argparse.Namespace):
    """The pipeline every worker loads, with the overrides ``vidgen render`` would apply."""
    from vidgen.distributed.ray_worker import PipelineSpec

    return PipelineSpec(model=args.model, config=args.config, overrides=overrides_of(args))


def _upscale(args: argparse.Namespace):
    from vidgen.video import Upscale

    return Upscale(getattr(args, "upscale", 1), getattr(args, "resample", "nearest"))


def render_one(
    args: argparse.Namespace, request: GenerationRequest, record: dict[str, Any], out: Path
) -> int:
    """One video (``request``, its seed set) on one replica of ``--sp`` workers; ``record`` is
    what ``OUT.parts/request.json`` records."""
    from vidgen.distributed.ray_cluster import DegreeError
    from vidgen.distributed.render import render_on_ray
    from vidgen.distributed.replica import WorkerLost

    if (getattr(args, "replicas", 1) or 1) != 1:
        raise DegreeError("--replicas applies to batches (--jobs FILE.jsonl); one video uses one replica")
    seed = request.seed
    progress: Progress | None = None

    def started(info) -> None:
        nonlocal progress
        if not args.quiet:
            unit = "GPU" if info.gpu else "CPU"
            decoding = " + a decode worker" if info.decode_worker else ""
            print(
                f"vidgen render: seed {seed}, {args.seconds:g} s at {info.fps} fps -> {out} "
                f"(Ray {info.cluster}, sp {info.layout.sp} on {info.layout.world} {unit} worker(s){decoding})",
                file=sys.stderr,
            )
        progress = Progress(info.num_frames, info.fps, info.recorded_frames, quiet=args.quiet)

    try:
        result = render_on_ray(
            request,
            out,
            spec=pipeline_spec(args),
            sp=args.sp,
            decode_worker=bool(getattr(args, "decode_worker", False)),
            address=getattr(args, "address", None),
            upscale=_upscale(args),
            record=record,
            on_start=started,
            on_chunk=lambda chunk, rtf: progress.update(len(chunk.frames), rtf),
            on_restart=lambda err: print(f"\nvidgen render: {err}; restarting", file=sys.stderr),
        )
    except WorkerLost as err:
        raise InputError(f"{err}; the render can be continued with --resume") from None
    finally:
        if progress is not None:
            progress.close()
    if not args.quiet:
        extra = f", {result.restarts} worker restart(s)" if result.restarts else ""
        print(f"vidgen render: wrote {out} ({result.frames} frames{extra})", file=sys.stderr)
    return 0


def job_defaults(args: argparse.Namespace):
    """What a line of the jobs file leaves out: the command line's values."""
    from vidgen.distributed.batch import JobDefaults

    return JobDefaults(request=request_of(args), settings=render_settings(args))


def render_jobs(args: argparse.Namespace) -> int:
    """``vidgen render --jobs FILE.jsonl --parallel ray``: exit status 0 if every job is done."""
    from vidgen.distributed.batch import read_jobs, render_batch_on_ray
    from vidgen.distributed.ray_cluster import DegreeError
    from vidgen.distributed.render import check_layout

    if args.parallel != "ray":
        raise DegreeError("--jobs runs on Ray: add --parallel ray (and --replicas N)")
    if getattr(args, "decode_worker", False):
        raise DegreeError("--decode-worker applies to one video, not to --jobs")
    check_layout(args.sp, args.replicas)  # before the file is read: a wrong degree is said first
    jobs = read_jobs(args.jobs, job_defaults(args))
    progress = _BatchProgress(jobs, args.replicas, args.quiet)
    try:
        outcomes = render_batch_on_ray(
            jobs,
            spec=pipeline_spec(args),
            sp=args.sp,
            replicas=args.replicas,
            address=getattr(args, "address", None),
            resume=args.resume,
            on_event=progress,
            upscale=_upscale(args),
        )
    finally:
        progress.close()
    failed = [o for o in outcomes if o.status == "failed"]
    if not args.quiet:
        done = sum(o.status == "done" for o in outcomes)
        skipped = sum(o.status == "skipped" for o in outcomes)
        print(f"vidgen render: {done} done, {skipped} already there, {len(failed)} failed", file=sys.stderr)
    for outcome in failed:
        print(f"vidgen render: line {outcome.number} failed: {outcome.error}", file=sys.stderr)
    return 1 if failed else 0


class _BatchProgress:
    """An overall bar (video seconds of all jobs) and one bar per replica (its current job's frames)."""

    def __init__(self, jobs: list[BatchJob], replicas: int, quiet: bool) -> None:
        self.quiet = quiet
        self.bars: dict[int, Any] = {}
        self.done = 0
        self.total_jobs = len(jobs)
        if quiet:
            return
        from tqdm import tqdm

        self.tqdm = tqdm
        self.overall = tqdm(
            total=round(sum(j.request.seconds or 0 for j in jobs), 2),
            unit="s",
            desc=f"jobs 0/{len(jobs)}",
            position=0,
            dynamic_ncols=True,
            file=sys.stderr,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} video s [{elapsed}<{remaining}]",
        )
        for r in range(replicas):
            self.bars[r] = tqdm(
                total=1,
                position=r + 1,
                desc=f"replica {r}: idle",
                unit="frame",
                dynamic_ncols=True,
                file=sys.stderr,
                leave=False,
            )

    def __call__(self, event: BatchEvent) -> None:
        if self.quiet:
            return
        bar = self.bars[event.replica.index]
        if event.kind == "start":
            bar.reset(total=event.job.request.num_frames(event.replica.fps))
            bar.set_description_str(f"replica {event.replica.index}: {event.job.out.name}")
        elif event.kind == "chunk":
            fps = event.replica.fps
            bar.update(len(event.chunk.frames))
            self.overall.update(round(len(event.chunk.frames) / fps, 4))
        elif event.kind == "restart":
            self.tqdm.write(
                f"vidgen render: a worker of replica {event.replica.index} died during line {event.job.number} "
                f"({event.job.out.name}); restarting it, the job continues from its last chunk",
                file=sys.stderr,
            )
        elif event.kind == "end":
            self.done += 1
            self.overall.set_description_str(f"jobs {self.done}/{self.total_jobs}")
            outcome = event.outcome
            message = f"{outcome.frames} frames" if outcome.status == "done" else outcome.error
            self.tqdm.write(
                f"vidgen render: line {outcome.number} {outcome.status}: {outcome.out} ({message})",
                file=sys.stderr,
            )
            bar.set_description_str(f"replica {event.replica.index}: idle")

    def close(self) -> None:
        if self.quiet:
            return
        for bar in self.bars.values():
            bar.close()
        self.overall.close()
