"""``vidgen render``: a prompt or storyboard to an MP4, written as it is made, resumable.

While rendering, ``OUT.parts/`` holds one segment per finished chunk, the request and the
generation state after the last complete chunk. A render that is killed (even with SIGKILL) and
rerun with ``--resume`` continues from there and ends with the frames an uninterrupted render
would have made; the MP4 itself only appears, under its final name, when the render completes.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from vidgen.config import check_override_names, load_config, parse_overrides, render_overrides
from vidgen.request import RECORD_FORMAT, GenerationRequest, random_seed, render_record
from vidgen.validation import (
    MAX_INT,
    InputError,
    check_number,
    check_seed,
    is_blank,
    parse_json,
    read_storyboard,
    read_text_file,
)


def add_sp_kind_argument(p: argparse.ArgumentParser) -> None:
    """``--sp-kind``, as ``vidgen render`` and ``vidgen serve`` take it."""
    p.add_argument(
        "--sp-kind",
        choices=["auto", "ulysses", "ring"],
        help="how --sp splits attention: ulysses (the heads must divide by sp), ring (any head count) "
        "or auto (default: ulysses when the heads divide, else ring)",
    )


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="render a video from a prompt or a storyboard")
    p.add_argument("text", nargs="?", metavar="PROMPT", help="what the video shows (same as --prompt)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--prompt", help="what the video shows")
    what.add_argument("--storyboard", help="TOML or JSON file of timed prompts (see the README)")
    what.add_argument(
        "--jobs", metavar="FILE.jsonl", help="a batch: one JSON video per line (needs --parallel ray)"
    )
    p.add_argument("--seconds", type=float, default=10.0, help="video length in seconds (default 10)")
    g = load_config("default").generation  # the embedded model's defaults, for the help text
    p.add_argument("--fps", type=int, help=f"frames per second (default: the model's; {g.fps})")
    p.add_argument("--height", type=int, help=f"frame height in pixels (default: the model's; {g.height})")
    p.add_argument("--width", type=int, help=f"frame width in pixels (default: the model's; {g.width})")
    p.add_argument(
        "--steps", type=int, help=f"sampler steps per chunk (default: the model's; {g.num_inference_steps})"
    )
    p.add_argument(
        "--guidance",
        type=float,
        help=f"classifier-free guidance scale, 1: off (default: the model's; {g.guidance_scale:g})",
    )
    p.add_argument(
        "--negative-prompt",
        help="what guidance steers away from, with --guidance above 1 (default: the model's; "
        f"{g.negative_prompt!r})",
    )
    p.add_argument(
        "--seed", type=int, help="random seed (default: random, printed; pass it again to reproduce)"
    )
    p.add_argument(
        "--upscale",
        type=int,
        default=1,
        metavar="N",
        help="enlarge the MP4's frames N times, not the model's (default 1)",
    )
    p.add_argument(
        "--resample",
        choices=["nearest", "lanczos"],
        default="nearest",
        help="how --upscale enlarges (default nearest: sharp pixels)",
    )
    p.add_argument("--config", help="a preset name or TOML file (default: the model's own)")
    p.add_argument("--model", help="a local pipeline folder or preset name (default: the embedded model)")
    p.add_argument("--transformer", help="a causal transformer checkpoint replacing the model's")
    p.add_argument("--lora", action="append", metavar="PATH[:SCALE]", help="fuse in a LoRA (repeatable)")
    p.add_argument(
        "--quantize", choices=["int8", "fp8"], help="quantize the transformer's linear layers (torchao)"
    )
    start = p.add_mutually_exclusive_group()
    start.add_argument(
        "--image", metavar="START.png", help="image-to-video: the video starts from this frame"
    )
    start.add_argument(
        "--continue", dest="continue_from", metavar="VIDEO.mp4", help="continue this clip for --seconds more"
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="TABLE.KEY=VALUE", help="override a config value"
    )
    p.add_argument("--out", help="output MP4 path (default: named after the prompt, in this folder)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted render of the same --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--parallel", choices=["none", "ray"], default="none", help="run on Ray (see the README)")
    p.add_argument("--sp", type=int, default=1, help="sequence-parallel degree with --parallel ray")
    add_sp_kind_argument(p)
    p.add_argument(
        "--replicas", type=int, default=1, help="pipeline replicas rendering --jobs in parallel (Ray)"
    )
    p.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, else a local one)")
    p.add_argument(
        "--decode-worker",
        action="store_true",
        help="with --parallel ray: decode frames on one more worker while the ranks denoise the next chunk",
    )
    p.set_defaults(run=run)


CLI_NAMES = {
    "prompt": "the prompt",
    "storyboard": "--storyboard",
    "seconds": "--seconds",
    "height": "--height",
    "width": "--width",
    "num_inference_steps": "--steps",
    "guidance_scale": "--guidance",
    "negative_prompt": "--negative-prompt",
    "seed": "--seed",
    "fps": "--fps",
    "image": "--image",
    "video": "--continue",
}
"""How ``vidgen render`` names a request's fields in its messages."""


_DESTS = {"video": "continue_from", "negative_prompt": "negative_prompt"}
"""Options argparse keeps under another name than their flag's."""


def request_of(args: argparse.Namespace) -> GenerationRequest:
    """The video the options ask for (not checked; the start file as an absolute path, as Ray
    workers and a later ``--resume`` from another folder need it)."""
    board = getattr(args, "storyboard", None)
    options = {
        field: getattr(args, _DESTS.get(field, flag.removeprefix("--")), None)
        for field, flag in CLI_NAMES.items()
        if field not in ("prompt", "storyboard")
    }
    return GenerationRequest(
        prompt=getattr(args, "prompt", None), storyboard=read_storyboard(board) if board else None, **options
    ).with_absolute_paths()


def render_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What shapes the MP4 besides the request: the pipeline loaded and the file's upscaling."""
    return {
        "model": args.model,
        "transformer": args.transformer,
        "lora": args.lora,
        "config": args.config,
        "set": list(args.set),
        "quantize": getattr(args, "quantize", None),
        "upscale": [args.upscale, args.resample],
    }


def saved_record(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """What ``OUT.parts/request.json`` records for this command line and ``seed``."""
    return render_record(dataclasses.replace(request_of(args), seed=seed), **render_settings(args))


def overrides_of(args: argparse.Namespace) -> dict[str, Any]:
    """The config overrides the render options ask for (``--set``, ``--fps``, ``--lora``, ...)."""
    return render_overrides(
        getattr(args, "set", None),
        fps=getattr(args, "fps", None),
        transformer=getattr(args, "transformer", None),
        lora=getattr(args, "lora", None),
        quantize=getattr(args, "quantize", None),
        sp_kind=getattr(args, "sp_kind", None),
    )


def load_pipeline(args: argparse.Namespace):
    from vidgen.pipelines import LongVideoPipeline

    return LongVideoPipeline.from_pretrained(args.model, config=args.config, **overrides_of(args))


def _what_to_render(args: argparse.Namespace) -> None:
    """The positional PROMPT is --prompt; exactly one of the three must be given."""
    given = [flag for flag in ("prompt", "storyboard", "jobs") if getattr(args, flag)]
    if args.text is not None:
        if given:
            raise InputError(f"give the prompt once: PROMPT or --{given[0]}, not both")
        args.prompt = args.text
    elif not given:
        raise InputError("say what to render: a PROMPT, --prompt, --storyboard or --jobs")
    if args.prompt is not None and is_blank(args.prompt):
        raise InputError("the prompt is empty: say what the video shows")


def probe_start(args: argparse.Namespace) -> tuple[int, int, int] | None:
    """``(frames, height, width)`` of ``--image`` / ``--continue`` from the file's header and
    packets, checked (None without either); the pipeline decodes it, resized frame by frame."""
    from vidgen.video.reading import probe_start as probe  # the module alone, no PyAV writers

    return probe(getattr(args, "image", None), getattr(args, "continue_from", None))


def check_request(args: argparse.Namespace) -> GenerationRequest:
    """The request of the options, checked (:meth:`GenerationRequest.validate`, named as the
    options are), with the options of the render itself: numbers that can never work (not finite,
    not positive, out of range) and text that is not UTF-8 are refused before anything heavy is
    imported (so at once). The limits that depend on the model and its config (length, steps,
    memory) are checked by ``LongVideoPipeline.check_inputs``."""
    request = request_of(args)
    request.validate(CLI_NAMES, what=not getattr(args, "jobs", None))
    if getattr(args, "set", None):  # syntax, non-finite numbers, undecodable text and unknown keys
        check_override_names(parse_overrides(args.set))
    for name in ("sp", "replicas", "upscale"):
        value = getattr(args, name, None)
        if value is not None:
            check_number(f"--{name}", value, integer=True, positive=True, maximum=MAX_INT)
    if getattr(args, "upscale", 1) > 16:
        raise InputError(f"--upscale enlarges up to 16 times, got {args.upscale}")
    return request


def print_fit_warnings(config, request: GenerationRequest) -> None:
    """What the model was not made for (words, sizes), on stderr; the render goes on."""
    from vidgen.pipelines.session import fit_warnings

    g = config.generation
    height, width = request.height or g.height, request.width or g.width
    for warning in fit_warnings(config, request.prompts(), height, width):
        print(f"vidgen render: warning: {warning}", file=sys.stderr)


def default_out_name(what: str) -> str:
    """``a red ball, bouncing!`` -> ``a-red-ball-bouncing.mp4`` (at most 60 characters before .mp4)."""
    from vidgen.video.naming import video_file_name  # the module alone: vidgen.video imports PyAV

    return video_file_name(what)


def run(args: argparse.Namespace) -> int:
    _what_to_render(args)
    request = check_request(args)
    if args.jobs:
        from vidgen.cli.render_ray import render_jobs

        return render_jobs(args)
    if not args.out:
        args.out = default_out_name(args.prompt or Path(args.storyboard).stem)
    out = Path(args.out)
    if out.suffix.lower() != ".mp4":
        raise InputError(f"--out must end in .mp4, got {args.out}")
    try:
        from vidgen.video.atomic import check_name_length  # os only; the package's PyAV loads later

        check_name_length(out)
    except OSError as err:
        raise InputError(f"--out: {err.strerror}") from None
    if out.is_dir():
        raise InputError(f"--out {args.out} is a folder: name the MP4 file to write")
    parts = out.with_name(out.name + ".parts")
    start = probe_start(args)
    if parts.exists() and not args.resume:
        raise InputError(
            f"an interrupted render exists at {parts}: pass --resume to continue it, or delete it"
        )
    settings = render_settings(args)
    resuming = args.resume and (parts / "request.json").is_file()
    if resuming:
        seed = _resume_seed(args, parts, render_record(request, **settings))
    else:
        seed = args.seed if args.seed is not None else random_seed()
    request = dataclasses.replace(request, seed=seed)

    if args.parallel == "ray":
        from vidgen.cli.render_ray import render_one
        from vidgen.config import parse_overrides
        from vidgen.pipelines.loading import resolve_model

        try:  # the workers load the weights; the driver reads the config for the warnings
            _, config = resolve_model(args.model, load_config(args.config) if args.config else None)
            print_fit_warnings(config.replace(**parse_overrides(args.set)), request)
        except InputError:
            pass  # the workers report it, as one line
        return render_one(args, request, render_record(request, **settings), out)

    # the arguments are checked: now the heavy imports (torch, diffusers)
    from vidgen.video import SegmentedRecording, Upscale

    pipe = load_pipeline(args)
    pipe.check_inputs(**request.stream_kwargs())  # check the request before anything is written
    size = (args.height or pipe.config.generation.height, args.width or pipe.config.generation.width)
    upscale = Upscale(args.upscale, args.resample)
    try:
        upscale.check((size[1], size[0]))
    except ValueError as err:
        raise InputError(str(err)) from None
    print_fit_warnings(pipe.config, request)
    if not resuming:
        try:
            parts.mkdir(parents=True, exist_ok=True)
            (parts / "request.json").write_text(json.dumps(render_record(request, **settings)))
        except OSError as err:
            raise InputError(f"cannot write next to {out}: {err.strerror}") from None
    recording = SegmentedRecording(parts, fps=pipe.config.generation.fps, upscale=upscale)
    done = len(recording.completed_chunks())
    state = parts / "state.safetensors"
    if recording.dropped is not None:
        first, why = recording.dropped
        print(f"vidgen render: {why}: chunk {first} and later are made again", file=sys.stderr)
    if (done or state.exists()) and not _state_fits(state, done):
        # the video is a function of its seed: made from its start again, the chunks recorded
        # are skipped, not re-encoded, and the rest are exactly the uninterrupted render's
        print(
            f"vidgen render: the saved state in {parts} is missing, damaged or ahead of the recorded "
            f"chunks: making the video from its start again (the {done} chunks recorded are kept)",
            file=sys.stderr,
        )
        for stale in [state, *parts.glob(state.name + ".*")]:
            stale.unlink(missing_ok=True)
    fps = pipe.config.generation.fps
    new_frames = request.num_frames(fps) or 0
    total_frames = new_frames + (start[0] if start is not None else 0)
    if start is not None and start[1:] != size:  # a warning: printed even with --quiet
        print(
            f"vidgen render: resizing the start frames from {start[2]}x{start[1]} to "
            f"{size[1]}x{size[0]} (stretched, Lanczos, as diffusers' VideoProcessor)",
            file=sys.stderr,
        )
    if not args.quiet:
        print(f"vidgen render: seed {seed}, {args.seconds:g} s at {fps} fps -> {out}", file=sys.stderr)
    progress = Progress(total_frames, fps, recording.num_frames(), quiet=args.quiet)
    try:
        for chunk in pipe.stream(**request.stream_kwargs(), state_path=state, resume=state.is_file()):
            if chunk.index >= done:  # a chunk recorded just before an interruption comes again
                recording.append(chunk.index, chunk.frames)
                progress.update(len(chunk.frames), chunk.metrics.real_time_factor)
        recording.finalize(out)
    except OSError as err:
        if err.errno not in DISK_REFUSALS:
            raise
        progress.close()
        # what was recorded stays whole (each segment and the state are written whole or not at all)
        print(
            f"vidgen render: error: the disk refused a write ({err.strerror}) after "
            f"{len(recording.completed_chunks())} chunks: make room and run the same command with "
            f"--resume to go on from there",
            file=sys.stderr,
        )
        return 1
    finally:
        progress.close()
    shutil.rmtree(parts, ignore_errors=True)
    if not args.quiet:
        print(f"vidgen render: wrote {out} ({total_frames} frames)", file=sys.stderr)
    return 0


DISK_REFUSALS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
"""Write errors that say the disk (or a quota, or a file size limit) is full, not that vidgen failed."""


def _state_fits(state: Path, done: int) -> bool:
    """Whether the state at ``state`` is whole and saved after a chunk the recording holds (it is
    saved after the chunk is recorded, so it is at most one chunk behind; a damaged segment re-made
    leaves it ahead)."""
    from vidgen.pipelines.state_file import saved_chunk

    chunk = saved_chunk(state)
    return chunk is not None and chunk < done


def _resume_seed(args: argparse.Namespace, parts: Path, record: dict[str, Any]) -> int:
    """The seed of the interrupted render at ``parts``, once its record equals this one's
    (:func:`~vidgen.request.render_record`; the seed aside)."""
    start_over = f"delete {parts} and run the command without --resume to start over"
    saved_file = parts / "request.json"
    try:
        saved = parse_json(read_text_file(saved_file, "saved request"), "saved request")
        fmt = saved.pop("format", None)
        seed = check_seed("the saved seed", saved.pop("seed"))
    except (InputError, KeyError, TypeError, AttributeError):
        raise InputError(f"--resume: {saved_file} is damaged: {start_over}") from None
    if fmt != RECORD_FORMAT:
        raise InputError(f"--resume: {saved_file} was written by another version of vidgen: {start_over}")
    if args.seed is not None and args.seed != seed:
        raise InputError(
            f"--resume: the interrupted render used --seed {seed}, not {args.seed}: resume without "
            f"--seed (or with --seed {seed}), or {start_over}"
        )
    record = {k: v for k, v in record.items() if k not in ("format", "seed")}
    if saved != record:
        differ = sorted(_option(k) for k in set(saved) | set(record) if saved.get(k) != record.get(k))
        raise InputError(
            f"--resume: {', '.join(differ)} differ from the interrupted render's "
            f"({saved_file}): resume with the same arguments, or {start_over}"
        )
    return seed


def _option(field: str) -> str:
    """A recorded field as the option that sets it, without dashes (``num_inference_steps``: steps)."""
    name = CLI_NAMES.get(field, "")
    return name.removeprefix("--") if name.startswith("--") else field


class Progress:
    """Chunks, video seconds made, real-time factor and ETA."""

    def __init__(self, total_frames: int, fps: int, initial: int, quiet: bool) -> None:
        self.fps = fps
        self.bar = None
        if not quiet:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total_frames, initial=initial, unit="frame", dynamic_ncols=True, file=sys.stderr
            )
        self.chunks = 0

    def update(self, frames: int, rtf: float) -> None:
        self.chunks += 1
        if self.bar is not None:
            made = (self.bar.n + frames) / self.fps
            self.bar.set_postfix_str(f"chunks={self.chunks} video={made:.1f}s rtf={rtf:.2f}x", refresh=False)
            self.bar.update(frames)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
