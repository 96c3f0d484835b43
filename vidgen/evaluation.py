"""Measuring a model on Shapes World: generate from prompts, judge with the spec's evaluator.

``evaluate_model`` renders short videos (adherence), long rollouts (drift-free windows) and
storyboards (change latency), and aggregates the verdicts of ``vidgen.shapes.evaluate``; with
``ablations`` it reruns the long rollouts with each drift correction switched off, so the effect
of each is a number. ``vidgen eval`` is its command line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from vidgen.shapes import captions, world
from vidgen.shapes.evaluate import VideoReport, evaluate_video
from vidgen.shapes.prompts import parse_prompt
from vidgen.validation import parse_json, read_text_file

Prompt = str | list[tuple[float, str]]

# name -> config overrides that switch one drift correction off (or on, for context noise)
ABLATIONS: dict[str, dict[str, object]] = {
    "no_sinks": {"generation.sink_frames": 0},
    "no_anchor": {"drift.anchor_stats": False},
    "no_prompt_recache": {"drift.recache_on_prompt_change": False},
    "periodic_recache": {"drift.recache_every": 8},
    "context_noise": {"generation.addnoise_condition": 0.05},
}


def read_prompt_file(path: str | Path) -> list[Prompt]:
    """One prompt per line; a storyboard is ``0: caption | 4: caption`` on one line; ``#`` comments."""
    prompts: list[Prompt] = []
    for number, line in enumerate(read_text_file(path, "prompts").splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "|" in line:
            try:
                prompts.append(captions.storyboard_from_text("\n".join(p.strip() for p in line.split("|"))))
            except ValueError as err:
                raise ValueError(f"{path}:{number}: {err}") from None
        else:
            try:  # the evaluator judges a video by its prompt's parse: one it cannot parse is refused now
                parse_prompt(line)
            except ValueError as err:
                raise ValueError(f"{path}:{number}: {str(err)[:120]}") from None
            prompts.append(line)
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


def held_out_prompts(count: int, seed: int = 0) -> list[str]:
    """Random scenes captioned with phrasings that training never uses."""
    rng = np.random.default_rng([seed, 1])
    return [captions.caption(world.sample_scene(rng), rng, held_out=True) for _ in range(count)]


def held_out_storyboards(count: int, seconds: float, changes: int = 2, seed: int = 0) -> list[Prompt]:
    rng = np.random.default_rng([seed, 2])
    boards = []
    for _ in range(count):
        board = world.sample_storyboard(rng, seconds, changes, min_segment=3.0)
        boards.append(captions.storyboard_captions(board, rng, held_out=True))
    return boards


@dataclass
class VideoResult:
    prompt: Prompt
    seconds: float
    seed: int
    adheres: bool
    frame_pass_rate: float
    window_pass_rate: float
    direction_ok: bool
    drift_free_rate: float
    drift_free: bool
    shape_right_rate: float
    """Share of frames whose object has the named shape."""
    change_latencies: list[float | None]
    failures: dict[str, int]
    real_time_factor: float
    frame_pass_start: float
    """Share of the first 10 seconds' frames (or the first tenth, if shorter) that pass rules 1-5."""
    frame_pass_end: float
    """The same for the last 10 seconds: below ``frame_pass_start`` when the video degrades."""
    late_stats_distance: float | None
    """Mean latent-statistics distance from the anchor over the last tenth of the chunks."""
    drift: list[dict] = field(default_factory=list)
    """Per chunk: time, stats distance, change energy, frozen, repetition, corrected."""


def _judge(frames: np.ndarray, prompt: Prompt, fps: int) -> VideoReport:
    return evaluate_video(frames, prompt, fps=fps)


def run_video(pipe, prompt: Prompt, seconds: float, seed: int) -> tuple[VideoResult, np.ndarray, VideoReport]:
    kwargs = {"storyboard": prompt} if isinstance(prompt, list) else {"prompt": prompt}
    started = time.perf_counter()
    frames, drift = [], []
    for chunk in pipe.stream(seconds=seconds, generator=seed, **kwargs):
        frames.append(chunk.frames)
        if chunk.metrics.drift is not None:
            drift.append({"time": chunk.start_time, **asdict(chunk.metrics.drift)})
    elapsed = time.perf_counter() - started
    video = np.concatenate(frames)
    fps = pipe.config.generation.fps
    report = _judge(video, prompt, fps)
    span = max(1, min(10 * fps, len(video) // 10))
    passed = [f.passed for f in report.frames]
    late = [d["stats_distance"] for d in drift[-max(1, len(drift) // 10) :]]
    result = VideoResult(
        prompt=prompt,
        seconds=seconds,
        seed=seed,
        adheres=report.adheres,
        frame_pass_rate=report.frame_pass_rate,
        window_pass_rate=report.window_pass_rate,
        direction_ok=report.direction_ok,
        drift_free_rate=report.drift_free_rate,
        drift_free=report.drift_free,
        shape_right_rate=report.shape_right_rate,
        change_latencies=report.change_latencies,
        failures=dict(report.failures),
        real_time_factor=len(video) / fps / elapsed,
        frame_pass_start=float(np.mean(passed[:span])),
        frame_pass_end=float(np.mean(passed[-span:])),
        late_stats_distance=float(np.mean(late)) if late else None,
        drift=drift,
    )
    return result, video, report


PER_VIDEO = "per_video"
MAX_REPORT_BYTES = 64 << 20
"""Largest report.json read (a 140-video report is ~0.2 MB)."""
"""The key of a report's per-video records (``{set name: [record, ...]}``), beside the summaries."""

COMPARED = ("frame_pass_rate", "shape_right_rate", "window_pass_rate", "direction_ok", "adheres")
"""What ``compare_reports`` pairs, video by video."""


def video_record(result: VideoResult) -> dict[str, object]:
    """One video's verdicts for the report (what ``compare_reports`` pairs), without the per-chunk
    drift trace."""
    record = asdict(result)
    record.pop("drift")
    return record


def _read_records(report: str | Path | dict) -> dict[tuple[str, str, int, float], dict]:
    """A report's per-video records keyed by (set, prompt, seed, seconds); ``report`` is a
    ``report.json``, the folder holding one, or the loaded dict."""
    if not isinstance(report, dict):
        path = Path(report)
        path = path / "report.json" if path.is_dir() else path
        if not path.exists():
            raise ValueError(f"no report at {path}: run `vidgen eval --out-dir` first")
        report = parse_json(read_text_file(path, "report", max_bytes=MAX_REPORT_BYTES), f"report {path}")
    sets = report.get(PER_VIDEO) if isinstance(report, dict) else None
    if not sets or not isinstance(sets, dict):
        raise ValueError("the report has no per-video records (written by vidgen eval since 2026-12-03)")
    records = {}
    try:
        for name, videos in sets.items():
            for v in videos:
                records[(name, json.dumps(v["prompt"]), int(v["seed"]), float(v["seconds"]))] = v
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ValueError("the report's per-video records are not as vidgen eval writes them") from None
    return records


def compare_reports(
    base: Sequence[str | Path | dict], new: Sequence[str | Path | dict]
) -> dict[str, dict[str, float | int]]:
    """Paired comparison of two models evaluated on the same videos (same prompts, seeds and
    lengths): per metric of ``COMPARED``, the mean of the per-video differences ``new - base``,
    its standard error and the number of pairs. Each side is one or more reports, pooled; videos
    present on one side only are left out, and no common video is a ValueError.

    Pairing removes the spread between prompts (some are easy for every model), which dominates
    the spread of a set's mean: two checkpoints' set means can differ by 5 points by chance while
    their paired difference has a standard error of about 2."""
    a: dict = {}
    b: dict = {}
    for report in base:
        a.update(_read_records(report))
    for report in new:
        b.update(_read_records(report))
    common = [k for k in a if k in b]
    if not common:
        raise ValueError("the two sides share no video (same prompts, seeds and lengths): nothing to pair")
    out: dict[str, dict[str, float | int]] = {}
    for metric in COMPARED:
        d = np.array([float(b[k][metric]) - float(a[k][metric]) for k in common])
        se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
        out[metric] = {"mean_difference": float(d.mean()), "standard_error": se, "pairs": len(d)}
    return out


def summarize(results: Sequence[VideoResult]) -> dict[str, object]:
    if not results:
        return {}
    latencies = [x for r in results for x in r.change_latencies]
    failures: dict[str, int] = {}
    for r in results:
        for reason, count in r.failures.items():
            failures[reason] = failures.get(reason, 0) + count
    return {
        "videos": len(results),
        "adherence_rate": float(np.mean([r.adheres for r in results])),
        "frame_pass_rate": float(np.mean([r.frame_pass_rate for r in results])),
        "window_pass_rate": float(np.mean([r.window_pass_rate for r in results])),
        "shape_right_rate": float(np.mean([r.shape_right_rate for r in results])),
        "direction_ok_rate": float(np.mean([r.direction_ok for r in results])),
        "drift_free_rate": float(np.mean([r.drift_free for r in results])),
        "drift_free_window_rate": float(np.mean([r.drift_free_rate for r in results])),
        "changes": len(latencies),
        "changes_within_1s": float(np.mean([x is not None and x <= 1.0 for x in latencies]))
        if latencies
        else None,
        "median_change_latency": float(np.median([x for x in latencies if x is not None]))
        if any(x is not None for x in latencies)
        else None,
        "frame_pass_start": float(np.mean([r.frame_pass_start for r in results])),
        "frame_pass_end": float(np.mean([r.frame_pass_end for r in results])),
        "late_stats_distance": float(np.mean(late))
        if (late := [r.late_stats_distance for r in results if r.late_stats_distance is not None])
        else None,
        "real_time_factor": float(np.mean([r.real_time_factor for r in results])),
        "failures": failures,
    }


def plot_long_video(report: VideoReport, result: VideoResult, path: Path) -> None:
    """Pass/fail per second and the drift measures over time, one PNG per long video."""
    from vidgen.plotting import pyplot

    plt = pyplot()

    fps = report.fps
    passed = np.array([f.passed for f in report.frames], dtype=float)
    seconds = len(passed) // fps
    per_second = passed[: seconds * fps].reshape(seconds, fps).mean(axis=1) if seconds else passed
    fig, axes = plt.subplots(3, 1, figsize=(10, 7), sharex=True)
    axes[0].plot(np.arange(len(per_second)), per_second, lw=0.8)
    for window in report.drift_free_windows:
        color = "tab:green" if window.passed else "tab:red"
        axes[0].axvspan(window.start / fps, window.stop / fps, color=color, alpha=0.08)
    axes[0].set_ylabel("frames passing\n(per second)")
    axes[0].set_ylim(-0.05, 1.05)
    title = result.prompt if isinstance(result.prompt, str) else " | ".join(p for _, p in result.prompt)
    axes[0].set_title(f"{title[:90]}\ndrift-free windows {report.drift_free_rate:.0%}", fontsize=9)
    times = [d["time"] for d in result.drift]
    axes[1].plot(times, [d["stats_distance"] for d in result.drift], lw=0.8, label="latent stats distance")
    axes[1].plot(times, [d["repetition"] for d in result.drift], lw=0.8, label="repetition")
    axes[1].legend(fontsize=8)
    axes[2].plot(times, [d["change_energy"] for d in result.drift], lw=0.8, label="change energy")
    frozen = [t for t, d in zip(times, result.drift) if d["frozen"]]
    if frozen:
        axes[2].scatter(frozen, [0] * len(frozen), s=4, color="tab:red", label="frozen")
    axes[2].legend(fontsize=8)
    axes[2].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def evaluate_model(
    pipe,
    *,
    prompts: Sequence[Prompt],
    seconds: float = 10.0,
    long_prompts: Sequence[Prompt] = (),
    long_seconds: float = 600.0,
    storyboards: Sequence[Prompt] = (),
    storyboard_seconds: float = 12.0,
    seed: int = 0,
    out_dir: str | Path | None = None,
    ablations: Sequence[str] = (),
    log=print,
) -> dict[str, object]:
    """The whole evaluation; returns (and writes to ``out_dir/report.json``) the summary tables."""
    out = Path(out_dir) if out_dir else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    report: dict[str, object] = {}
    per_video: dict[str, list[dict[str, object]]] = {}

    def run_set(
        name: str, items: Sequence[Prompt], length: float, plot: bool, pipe_=pipe
    ) -> list[VideoResult]:
        results = []
        for i, prompt in enumerate(items):
            result, _, video_report = run_video(pipe_, prompt, length, seed + i)
            results.append(result)
            verdict = "adheres" if result.adheres else "fails"
            log(
                f"[{name} {i + 1}/{len(items)}] {verdict} frames={result.frame_pass_rate:.0%} "
                f"drift-free={result.drift_free_rate:.0%} rtf={result.real_time_factor:.1f}x  {str(prompt)[:70]}"
            )
            if plot and out:
                plot_long_video(video_report, result, out / f"{name}_{i:03d}.png")
        per_video[name] = [video_record(r) for r in results]
        return results

    if prompts:
        report["short"] = summarize(run_set("short", prompts, seconds, plot=False))
    if storyboards:
        report["storyboards"] = summarize(run_set("storyboard", storyboards, storyboard_seconds, plot=False))
    if long_prompts:
        report["long"] = summarize(run_set("long", long_prompts, long_seconds, plot=True))
        base_config = pipe.config
        for name in ablations:
            pipe.config = base_config.replace(**ABLATIONS[name])
            try:
                report[f"long_{name}"] = summarize(
                    run_set(f"long_{name}", long_prompts, long_seconds, plot=False)
                )
            finally:
                pipe.config = base_config
    report[PER_VIDEO] = per_video
    if out:
        (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    return report
