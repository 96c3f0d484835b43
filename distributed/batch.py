"""Many videos across N Ray replicas (``vidgen render --jobs FILE.jsonl --parallel ray --replicas N``).

Each line of the file is one video (a JSON object)::

    {"prompt": "a red circle", "seconds": 4, "seed": 1, "out": "videos/a.mp4"}
    {"storyboard": [[0, "a red circle"], [2, "a blue square"]], "seconds": 4, "out": "videos/b.mp4"}

Keys: ``out`` (required, .mp4, relative to the current folder), ``prompt`` or ``storyboard`` (a
list of ``[start, prompt]`` or a storyboard file), and optionally ``seconds``, ``seed``, ``height``,
``width``, ``steps``, ``guidance``, ``set`` (a list of ``"generation.key=value"``), and ``image``
(a start frame) or ``continue`` (a clip continued for ``seconds`` more), as ``vidgen render
--image`` / ``--continue``; a key left out takes its :class:`JobDefaults` value (the command
line's ``--seconds``, ``--seed`` + line number, ...).

One driver thread per replica takes the next job from a shared queue and records it exactly as a
single render does (``OUT.parts/``, see ``vidgen.distributed.render``). When a worker dies, its
replica is restarted and the job goes back to the front of the queue: whichever replica takes it
next continues after its last recorded chunk. A job is taken from the queue by one thread at a
time and its video is joined once, so none is lost or made twice.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vidgen.distributed.ray_cluster import (
    RayParallelism,
    connect,
    is_loopback_cluster,
    place_workers,
    rendezvous_dir,
)
from vidgen.distributed.ray_worker import WORK_DIR, PipelineSpec
from vidgen.distributed.render import check_layout, record_video, unwrapped
from vidgen.distributed.replica import Replica, WorkerLost
from vidgen.request import GenerationRequest, random_seed, render_record
from vidgen.validation import (
    InputError,
    check_seed,
    parse_json,
    parse_storyboard,
    read_storyboard,
    read_text_file,
)

_FIELD_KEYS = {
    **{key: key for key in ("prompt", "storyboard", "seconds", "seed", "height", "width", "image")},
    **{"num_inference_steps": "steps", "guidance_scale": "guidance", "video": "continue"},
    "negative_prompt": "negative_prompt",
}
"""A request's fields as a line of the jobs file names them."""
_JOB_KEYS = {*_FIELD_KEYS.values(), "set", "out"}
_PER_VIDEO_TABLES = ("generation.", "drift.")
MAX_JOBS_BYTES = 16 << 20
"""Largest jobs file read (16 MiB)."""


@dataclass(frozen=True)
class JobDefaults:
    """What a line of a jobs file leaves out, and the settings the whole batch shares (each job's
    ``request.json`` records them, so ``--resume`` can tell a changed batch)."""

    request: GenerationRequest = field(default_factory=lambda: GenerationRequest(seconds=10.0))
    """The values a line does not give (no prompt); a line without a seed gets this seed + its
    line number (None: a random one)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """What shapes every video besides its request (the pipeline, the upscaling), as ``vidgen
    render`` records it."""


@dataclass
class BatchJob:
    number: int
    """Line number in the jobs file (1-based)."""
    request: GenerationRequest
    """The video, its seed set and its start file an absolute path."""
    out: Path
    record: dict[str, Any]
    """What ``OUT.parts/request.json`` records (:func:`~vidgen.request.render_record`, as the
    single-process render writes it)."""
    attempts: int = 0

    @property
    def parts(self) -> Path:
        return self.out.with_name(self.out.name + ".parts")


@dataclass
class JobOutcome:
    number: int
    out: Path
    status: str
    """``done``, ``skipped`` (its video exists, --resume) or ``failed``."""
    frames: int = 0
    restarts: int = 0
    replicas: list[int] = field(default_factory=list)
    """Replicas that worked on it, in order."""
    error: str = ""


@dataclass
class BatchEvent:
    """What ``run_batch`` reports as it goes: ``kind`` is ``start``, ``chunk``, ``restart`` or ``end``."""

    kind: str
    job: BatchJob
    replica: Replica
    chunk: Any = None
    """``chunk``: the chunk just recorded."""
    recorded: int = 0
    """``start``: chunks of the job already recorded (a job taken again after a failure > 0)."""
    outcome: JobOutcome | None = None


MAX_PROBLEMS_SHOWN = 20
"""Bad lines a refused jobs file names (the count of the others follows)."""


class JobFileError(InputError):
    """A jobs file that cannot be run; the message names the line."""


def read_jobs(path: str | Path, defaults: JobDefaults | None = None) -> list[BatchJob]:
    """Parse a JSONL jobs file; what a line leaves out comes from ``defaults``. A line that cannot
    run is a :class:`JobFileError` naming it, raised before any job runs."""
    defaults = defaults or JobDefaults()
    try:
        text = read_text_file(path, "jobs", max_bytes=MAX_JOBS_BYTES)
    except InputError as err:
        raise JobFileError(str(err)) from None
    jobs: list[BatchJob] = []
    outs: dict[Path, int] = {}
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{number}"
        try:
            jobs.append(_read_job(line, where, number, defaults, outs))
        except InputError as err:
            message = str(err)
            problems.append(message if message.startswith(where) else f"{where}: {message}")
    if problems:  # every bad line at once, so that one round of fixes makes the file run
        shown = problems[:MAX_PROBLEMS_SHOWN]
        more = len(problems) - len(shown)
        tail = f"; and {more} more bad lines" if more else ""
        raise JobFileError(
            (shown[0] if len(problems) == 1 else f"{len(problems)} bad lines: " + "; ".join(shown)) + tail
        )
    if not jobs:
        raise JobFileError(f"{path} holds no jobs")
    return jobs


def _read_job(line: str, where: str, number: int, defaults: JobDefaults, outs: dict[Path, int]) -> BatchJob:
    """One line of a jobs file; every value checked here, so a bad line fails before any job runs."""
    from vidgen.config import parse_overrides
    from vidgen.video.reading import probe_start

    try:
        entry = parse_json(line, where)
    except InputError as err:
        message = str(err)
        if message.startswith("cannot parse"):
            message = f"{where}: not JSON ({message.removeprefix(f'cannot parse {where}: ')})"
        raise JobFileError(message) from None
    if not isinstance(entry, dict):
        raise JobFileError(f"{where}: each line must be a JSON object")
    unknown = sorted(set(entry) - _JOB_KEYS)
    if unknown:
        raise JobFileError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_JOB_KEYS))})")
    if ("prompt" in entry) == ("storyboard" in entry):
        raise JobFileError(f'{where}: give exactly one of "prompt" or "storyboard"')
    out = Path(str(entry.get("out", "")))
    if out.suffix.lower() != ".mp4":
        raise JobFileError(f'{where}: "out" must be an .mp4 path, got {entry.get("out")!r}')
    out = out.resolve()
    if out in outs:
        raise JobFileError(f'{where}: "out" {out} is also line {outs[out]}\'s output')
    outs[out] = number
    board = entry.get("storyboard")
    if isinstance(board, str):
        board = read_storyboard(board)
    elif board is not None:
        if not isinstance(board, list) or not all(isinstance(e, list) and len(e) == 2 for e in board):
            raise JobFileError(f'{where}: "storyboard" must be a file or a list of [start, prompt]')
        board = parse_storyboard(json.dumps(board), f'{where}: "storyboard"', toml=False)
    job_set = entry.get("set", [])
    if not isinstance(job_set, list) or not all(isinstance(s, str) for s in job_set):
        raise JobFileError(f'{where}: "set" must be a list of "table.key=value" strings')
    overrides = parse_overrides(job_set)
    wrong = [key for key in overrides if not key.startswith(_PER_VIDEO_TABLES)]
    if wrong:
        raise JobFileError(
            f'{where}: "set" may change generation.* and drift.* per video, not {wrong[0]!r} '
            "(pass it to the command with --set)"
        )
    if "image" in entry and "continue" in entry:
        raise JobFileError(f'{where}: give "image" or "continue", not both')
    image, clip = entry.get("image"), entry.get("continue")
    try:  # unreadable now is unreadable on the workers: say so before anything runs
        probe_start(image, clip)
    except InputError as err:
        raise JobFileError(f"{where}: {err}") from None
    d = defaults.request
    request = dataclasses.replace(
        d,
        prompt=entry.get("prompt"),
        storyboard=board,
        seconds=entry.get("seconds", d.seconds),
        height=entry.get("height", d.height),
        width=entry.get("width", d.width),
        num_inference_steps=entry.get("steps", d.num_inference_steps),
        guidance_scale=entry.get("guidance", d.guidance_scale),
        negative_prompt=entry.get("negative_prompt", d.negative_prompt),
        overrides={**d.overrides, **overrides},
        image=image,
        video=clip,
    )
    names = {field: f'{where}: "{key}"' for field, key in _FIELD_KEYS.items()}
    request.validate(names)
    if request.seconds is None:
        raise JobFileError(f'{where}: "seconds" is missing: give the video\'s length')
    seed = entry.get("seed")
    if seed is None:
        seed = (d.seed + number) if d.seed is not None else random_seed(number)
    request = dataclasses.replace(request, seed=check_seed(names["seed"], seed)).with_absolute_paths()
    return BatchJob(number, request, out, render_record(request, **defaults.settings))


def _prepare(job: BatchJob, resume: bool) -> str | None:
    """Check the job's ``.parts`` folder; returns ``"skipped"`` for a finished video. Nothing is
    written: :func:`_write_request` does, once the replicas are placed."""
    parts = job.parts
    if parts.exists():
        if not resume:
            raise JobFileError(
                f"an interrupted render exists at {parts}: pass --resume to continue it, or delete it"
            )
        saved_file = parts / "request.json"
        if saved_file.is_file():
            try:
                saved = json.loads(saved_file.read_text())
            except ValueError:
                saved = None
            if saved != job.record:
                raise JobFileError(f"line {job.number}: --resume, but the job differs from {saved_file}")
            return None
    elif resume and job.out.is_file():
        return "skipped"
    return None


def _write_request(job: BatchJob) -> None:
    if not (job.parts / "request.json").is_file():
        job.parts.mkdir(parents=True, exist_ok=True)
        (job.parts / "request.json").write_text(json.dumps(job.record))


def run_batch(
    jobs: list[BatchJob],
    spec: PipelineSpec,
    layout: RayParallelism,
    *,
    resume: bool = False,
    max_restarts: int = 3,
    on_event: Callable[[BatchEvent], None] | None = None,
    upscale: Any = None,
) -> list[JobOutcome]:
    """Render ``jobs`` on ``layout.replicas`` replicas of ``layout.sp`` workers (Ray must be
    connected). Returns one outcome per job, in file order. ``upscale``: as ``--upscale``."""
    outcomes: dict[int, JobOutcome] = {}
    queue: collections.deque[BatchJob] = collections.deque()
    for job in jobs:
        if _prepare(job, resume) == "skipped":
            outcomes[job.number] = JobOutcome(job.number, job.out, "skipped")
        else:
            queue.append(job)
    if not queue:
        return [outcomes[j.number] for j in jobs]

    lock = threading.Lock()
    placement = place_workers(
        layout
    )  # before anything is written: a layout that cannot be placed leaves nothing
    for job in queue:
        _write_request(job)
    loopback = is_loopback_cluster()
    replicas = [
        Replica(i, spec, placement, layout.sp, rendezvous_dir(), loopback=loopback)
        for i in range(layout.replicas)
    ]

    def emit(event: BatchEvent) -> None:
        if on_event is not None:
            with lock:
                on_event(event)

    def take() -> BatchJob | None:
        with lock:
            return queue.popleft() if queue and not stopping.is_set() else None

    def finish(outcome: JobOutcome) -> None:
        with lock:
            outcomes[outcome.number] = outcome

    def work(replica: Replica) -> None:
        try:
            replica.start()
        except Exception as err:  # a dead worker, or the model failing to load: this replica is out
            start_errors.append(f"replica {replica.index} could not start: {err}")
            return
        while (batch_job := take()) is not None:
            batch_job.attempts += 1
            worked_on = outcomes_by_job.setdefault(batch_job.number, [])
            worked_on.append(replica.index)
            emit(BatchEvent("start", batch_job, replica, recorded=_recorded_chunks(batch_job.parts)))
            try:
                result = record_video(
                    replica,
                    batch_job.request,
                    batch_job.parts,
                    batch_job.out,
                    max_restarts=0,
                    on_chunk=lambda chunk, b=batch_job: emit(BatchEvent("chunk", b, replica, chunk)),
                    upscale=upscale,
                )
            except WorkerLost as err:
                if stopping.is_set():
                    return
                emit(BatchEvent("restart", batch_job, replica))
                with lock:
                    if batch_job.attempts <= max_restarts:
                        queue.appendleft(batch_job)  # any replica continues it from its last chunk
                    else:
                        outcomes[batch_job.number] = JobOutcome(
                            batch_job.number, batch_job.out, "failed", replicas=worked_on, error=str(err)
                        )
                try:
                    replica.restart()
                except Exception as restart_err:
                    start_errors.append(f"replica {replica.index} lost: {restart_err}")
                    return
                continue
            except Exception as err:  # this job's own error (a bad request, a full disk): the next job
                outcome = JobOutcome(
                    batch_job.number, batch_job.out, "failed", replicas=worked_on, error=f"{err}"
                )
            else:
                outcome = JobOutcome(
                    batch_job.number,
                    batch_job.out,
                    "done",
                    frames=result.frames,
                    restarts=batch_job.attempts - 1,
                    replicas=worked_on,
                )
            finish(outcome)
            emit(BatchEvent("end", batch_job, replica, outcome=outcome))

    outcomes_by_job: dict[int, list[int]] = {}
    start_errors: list[str] = []
    stopping = threading.Event()
    threads = [
        threading.Thread(target=work, args=(r,), name=f"vidgen-replica-{r.index}", daemon=True)
        for r in replicas
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        stopping.set()  # interrupted: the threads see their workers go and stop
        for replica in replicas:
            replica.stop()
        placement.remove()
    reason = "; ".join(start_errors) or "no replica was left to run it"
    for job in jobs:  # jobs left when every replica was lost
        outcomes.setdefault(job.number, JobOutcome(job.number, job.out, "failed", error=f"not run: {reason}"))
    return [outcomes[j.number] for j in jobs]


def _recorded_chunks(parts: Path) -> int:
    try:
        return len(json.loads((parts / "manifest.json").read_text())["chunks"])
    except (OSError, ValueError, KeyError):
        return 0


def render_batch_on_ray(
    jobs: list[BatchJob],
    *,
    spec: PipelineSpec | None = None,
    sp: int = 1,
    replicas: int = 1,
    address: str | None = None,
    resume: bool = False,
    on_event: Callable[[BatchEvent], None] | None = None,
    upscale: Any = None,
) -> list[JobOutcome]:
    """:func:`run_batch` on the Ray cluster at ``address`` (default ``RAY_ADDRESS``, else a local
    one, shut down at the end), with ``replicas`` replicas of ``sp`` workers loading ``spec``.
    Degrees that cannot run and a batch that cannot start raise
    :class:`~vidgen.validation.InputError`; one job's failure is its :class:`JobOutcome`."""
    layout = check_layout(sp, replicas)
    started = connect(address)
    try:
        return run_batch(
            jobs, spec or PipelineSpec(), layout, resume=resume, on_event=on_event, upscale=upscale
        )
    except InputError as err:
        raise unwrapped(err) from None
    finally:
        if started == "local":
            import ray

            ray.shutdown()


__all__ = [
    "WORK_DIR",
    "BatchEvent",
    "BatchJob",
    "JobDefaults",
    "JobOutcome",
    "read_jobs",
    "render_batch_on_ray",
    "run_batch",
]
