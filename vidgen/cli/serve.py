"""``vidgen serve``: the Gradio streaming page (see ``vidgen.ui.app`` for the page and its API)."""

from __future__ import annotations

import argparse

from vidgen.cli.render import add_sp_kind_argument
from vidgen.validation import InputError  # light: no torch


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="serve the live video generation page (Gradio)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=7860, help="port to listen on (default 7860)")
    p.add_argument("--model", help="a local pipeline folder or preset (default: the embedded model)")
    p.add_argument("--config", help="a preset name or TOML file")
    p.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="where videos are generated: this process (local) or Ray Serve replicas (ray)",
    )
    p.add_argument(
        "--sp",
        type=int,
        default=1,
        metavar="N",
        help="with --backend ray: processes per replica sharing each video's tokens (sequence parallelism)",
    )
    add_sp_kind_argument(p)
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="chunks generated at the same time; the videos streaming take turns for them chunk by chunk "
        "(default 1; with --backend ray, one per replica)",
    )
    p.add_argument(
        "--streams",
        type=int,
        default=4,
        help="videos streamed at the same time, each with its own cache; more wait in the queue (default 4)",
    )
    p.add_argument(
        "--queue-size",
        type=int,
        default=8,
        help="requests that may wait for a stream; beyond that the page says it is busy (default 8)",
    )
    p.add_argument(
        "--file-ttl",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="how long finished videos are kept for download (default 3600)",
    )
    p.add_argument(
        "--segment-seconds",
        type=float,
        default=1.0,
        help="length of each stream segment, at least 1 (default 1)",
    )
    p.add_argument(
        "--max-lead",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="how far generation may run ahead of the stream, so prompt changes show soon (0: no limit)",
    )
    p.add_argument(
        "--upscale",
        type=int,
        default=1,
        metavar="N",
        help="show and offer the video N times the model's size (default 1)",
    )
    p.add_argument(
        "--resample",
        choices=["nearest", "lanczos"],
        default="nearest",
        help="how --upscale enlarges (default nearest: sharp pixels)",
    )
    p.add_argument(
        "--max-upload-mb",
        type=float,
        default=32.0,
        metavar="MB",
        help="largest start image or clip accepted; a larger upload is refused (default 32)",
    )
    p.add_argument(
        "--batch-sessions",
        type=int,
        default=4,
        metavar="N",
        help="streams whose chunks one --concurrency slot makes together, one batched transformer "
        "call per step (default 4; 1: one stream per slot)",
    )
    p.add_argument(
        "--history-mb",
        type=float,
        default=64.0,
        metavar="MB",
        help="states each stream keeps so that it can go back (the page's back control; default 64; 0: none)",
    )
    p.add_argument(
        "--max-side",
        type=int,
        metavar="PIXELS",
        help="largest height or width a request may ask for (default: twice the model's default size)",
    )
    p.add_argument(
        "--max-steps",
        type=int,
        metavar="N",
        help="most sampler steps a request may ask for (default: twice the model's default, at least 16)",
    )
    p.add_argument(
        "--max-session-seconds",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wall-clock time one video may stream before it is ended (default 0: no limit)",
    )
    p.set_defaults(run=run)


def check_parallel(args: argparse.Namespace) -> None:
    """``--sp`` / ``--sp-kind`` make sense with Ray Serve replicas only (the local backend is this
    one process); checked before anything heavy is imported."""
    if isinstance(args.sp, bool) or args.sp < 1:
        raise InputError(f"--sp must be a positive integer, got {args.sp}")
    if args.backend != "ray" and (args.sp != 1 or args.sp_kind):
        flag = f"--sp {args.sp}" if args.sp != 1 else f"--sp-kind {args.sp_kind}"
        raise InputError(
            f"{flag} applies to --backend ray (the local backend is one process): add --backend ray"
        )


def run(args: argparse.Namespace) -> int:
    check_parallel(args)
    from vidgen.ui.settings import ServeSettings, check_address  # light: no torch, no Gradio

    # every option is checked before the model loads: a mistake is one line, exit status 2
    settings = ServeSettings(
        concurrency=args.concurrency,
        batch_sessions=args.batch_sessions,
        history_mb=args.history_mb,
        streams=args.streams,
        queue_size=args.queue_size,
        file_ttl=args.file_ttl,
        segment_seconds=args.segment_seconds,
        max_lead=args.max_lead,
        upscale=args.upscale,
        resample=args.resample,
        max_upload_mb=args.max_upload_mb,
        max_side=args.max_side,
        max_steps=args.max_steps,
        max_session_seconds=args.max_session_seconds,
    )
    check_address(args.host, args.port)

    from vidgen.ui.app import run_server

    return run_server(
        settings,
        backend=args.backend,
        model=args.model,
        config=args.config,
        host=args.host,
        port=args.port,
        sp=args.sp,
        sp_kind=args.sp_kind,
    )
