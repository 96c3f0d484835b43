"""``vidgen eval``: measure a model against the Shapes World evaluator, or judge an existing MP4.

vidgen eval --held-out 20 --seconds 10                 # adherence on unseen phrasings
vidgen eval --held-out 5 --long 10 --long-seconds 600  # plus 10-minute drift-free rollouts
vidgen eval --storyboards 10                           # prompt changes: latency
vidgen eval --prompts prompts.txt --ablate             # each drift correction switched off
vidgen eval --video out.mp4 --prompt "a red circle moving left on a black background"
vidgen eval --compare old/std,old/B new/std,new/B        # paired differences, with standard errors
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vidgen.validation import InputError, read_storyboard

DEFAULT_OUT = "outputs/eval"


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="evaluate a model (or an MP4) with the Shapes World evaluator")
    p.add_argument("--prompts", help="file: one prompt per line, or a storyboard '0: ... | 4: ...'")
    p.add_argument(
        "--held-out", type=int, default=0, help="N random prompts in phrasings never used in training"
    )
    p.add_argument("--storyboards", type=int, default=0, help="N random storyboards (2 changes each)")
    p.add_argument("--long", type=int, default=0, help="N long rollouts (held-out prompts) for drift")
    p.add_argument("--seconds", type=float, default=10.0, help="length of the short videos")
    p.add_argument("--long-seconds", type=float, default=600.0, help="length of the long rollouts")
    p.add_argument("--storyboard-seconds", type=float, default=12.0)
    p.add_argument(
        "--ablate", action="store_true", help="rerun the long rollouts with each drift correction off"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", help="a local pipeline folder or preset (default: the embedded model)")
    p.add_argument("--config", help="a preset name or TOML file")
    p.add_argument("--set", action="append", default=[], metavar="TABLE.KEY=VALUE")
    p.add_argument("--quantize", choices=["int8", "fp8"], help="quantize the transformer (as vidgen render)")
    p.add_argument("--out-dir", default=DEFAULT_OUT, help="report.json and PNG plots")
    p.add_argument(
        "--compare",
        nargs=2,
        metavar=("BASE", "NEW"),
        help="pair two evaluated models video by video: report.json files or their folders, "
        "several joined by commas; prints the mean differences with their standard errors "
        "(and writes compare.json when --out-dir is given)",
    )
    p.add_argument("--video", help="judge this MP4 instead of generating (needs --prompt or --storyboard)")
    p.add_argument("--prompt", help="the prompt of --video")
    p.add_argument("--storyboard", help="storyboard file of --video (TOML/JSON)")
    p.set_defaults(run=run)


def _print_table(report: dict) -> None:
    rows = [
        ("adherence", "adherence_rate"),
        ("frames passing", "frame_pass_rate"),
        ("1-s windows passing", "window_pass_rate"),
        ("shape right (frames)", "shape_right_rate"),
        ("direction right", "direction_ok_rate"),
        ("drift-free videos", "drift_free_rate"),
        ("drift-free 10-s windows", "drift_free_window_rate"),
        ("changes within 1 s", "changes_within_1s"),
        ("frames passing, first 10 s", "frame_pass_start"),
        ("frames passing, last 10 s", "frame_pass_end"),
        ("late stats distance", "late_stats_distance"),
        ("real-time factor", "real_time_factor"),
    ]
    from vidgen.evaluation import PER_VIDEO

    names = [n for n in report if n != PER_VIDEO]
    width = max(12, *(len(n) + 2 for n in names))
    print(f"{'':28s}" + "".join(f"{n:>{width}s}" for n in names))
    for label, key in rows:
        cells = []
        for name in names:
            value = report[name].get(key)
            cells.append(f"{'-':>{width}s}" if value is None else f"{value:>{width}.3f}")
        print(f"{label:28s}" + "".join(cells))
    for name in names:
        failures = report[name].get("failures") or {}
        if failures:
            print(f"failures ({name}): " + ", ".join(f"{k}={v}" for k, v in sorted(failures.items())))


def _judge_file(args: argparse.Namespace) -> int:
    from vidgen.shapes.evaluate import evaluate_video
    from vidgen.video import read_video

    if not (args.prompt or args.storyboard):
        raise InputError("--video needs --prompt or --storyboard: what should it show?")
    try:
        frames, fps = read_video(args.video)
    except (FileNotFoundError, ValueError) as err:
        raise InputError(str(err)) from None
    prompt = read_storyboard(args.storyboard) if args.storyboard else args.prompt
    try:
        report = evaluate_video(frames, prompt, fps=int(round(float(fps))))
    except ValueError as err:
        raise InputError(str(err)) from None
    summary = {
        "frames": report.num_frames,
        "adheres": report.adheres,
        "frame_pass_rate": report.frame_pass_rate,
        "window_pass_rate": report.window_pass_rate,
        "direction_ok": report.direction_ok,
        "drift_free_rate": report.drift_free_rate,
        "change_latencies": report.change_latencies,
        "failures": report.failures,
    }
    print(json.dumps(summary, indent=1))
    return 0 if report.adheres else 1


def _compare(args: argparse.Namespace) -> int:
    from vidgen.evaluation import compare_reports

    base, new = ([p for p in side.split(",") if p] for side in args.compare)
    try:
        result = compare_reports(base, new)
    except ValueError as err:
        raise InputError(str(err)) from None
    labels = {
        "frame_pass_rate": "frames passing",
        "shape_right_rate": "shape right (frames)",
        "window_pass_rate": "1-s windows passing",
        "direction_ok": "direction right (rule 7)",
        "adheres": "adherence",
    }
    pairs = next(iter(result.values()))["pairs"]
    print(f"paired over {pairs} videos, new - base, points (mean +- standard error):")
    for metric, row in result.items():
        mean, se = 100 * row["mean_difference"], 100 * row["standard_error"]
        print(f"  {labels[metric]:24s} {mean:+6.1f} +- {se:4.1f}")
    if args.out_dir != DEFAULT_OUT:
        Path(args.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.out_dir) / "compare.json").write_text(json.dumps(result, indent=1))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.video:
        return _judge_file(args)
    if args.compare:
        return _compare(args)
    from vidgen import evaluation
    from vidgen.cli.render import load_pipeline

    try:
        prompts = evaluation.read_prompt_file(args.prompts) if args.prompts else []
    except ValueError as err:  # a line that is not a prompt or a storyboard, a file too big
        raise InputError(f"--prompts: {err}") from None
    prompts += evaluation.held_out_prompts(args.held_out, args.seed)
    storyboards = [p for p in prompts if isinstance(p, list)]
    prompts = [p for p in prompts if isinstance(p, str)]
    storyboards += evaluation.held_out_storyboards(args.storyboards, args.storyboard_seconds, seed=args.seed)
    long_prompts = evaluation.held_out_prompts(args.long, args.seed + 1000)
    if not (prompts or storyboards or long_prompts):
        raise InputError("nothing to evaluate: pass --prompts, --held-out, --storyboards, --long or --video")
    args.transformer = None
    args.fps = None
    pipe = load_pipeline(args)
    report = evaluation.evaluate_model(
        pipe,
        prompts=prompts,
        seconds=args.seconds,
        long_prompts=long_prompts,
        long_seconds=args.long_seconds,
        storyboards=storyboards,
        storyboard_seconds=args.storyboard_seconds,
        seed=args.seed,
        out_dir=args.out_dir,
        ablations=list(evaluation.ABLATIONS) if args.ablate else [],
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    _print_table(report)
    print(f"report: {Path(args.out_dir) / 'report.json'}")
    return 0
