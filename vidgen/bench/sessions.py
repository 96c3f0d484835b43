"""``vidgen bench sessions``: N live sessions of one model in one process, batched or not.

For each N of ``--sessions`` (default 1, 2, 4, 8), N sessions (different prompts and seeds, each
``--seconds`` long) are read to their end in three ways, on the same pipeline, one after another:

* **turns**: one compute thread makes their chunks in turn, chunk by chunk (a Serve replica with
  one compute thread; the page with ``--concurrency 1 --batch-sessions 1``);
* **threads**: each session on its own thread, unbatched (the page with ``--concurrency N
  --batch-sessions 1``);
* **batched**: each session on its own thread, their transformer calls made together
  (:mod:`vidgen.pipelines.batching`; ``--lanes`` forwards at once).

Per way and N: aggregate video seconds per wall second, each session's real-time factor (its
video seconds over the wall time to its last chunk), time to first chunk, the longest wait between
two chunks of one session over the median (starvation), the process's resident memory before,
during and after the sessions closed, and the largest pixel difference of each session's frames
from the turns run (batch invariance: 0 means identical). Everything is loopback-free (no server)
and bounded by ``--seconds`` x N.

The table, ``sessions.json`` and ``sessions.png`` (throughput against N) go to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import torch

from vidgen.bench.pipeline import machine_info, memory_mib
from vidgen.pipelines.memory import trim_heap

PROMPTS = [
    "a red circle moves right on a black background",
    "a blue square drifts down over a gray background",
    "a green triangle bounces to the left on a white background",
    "a yellow circle zips up on a black background",
    "a purple square slides left on a gray background",
    "an orange triangle falls on a white background",
    "a cyan circle wanders on a black background",
    "a white square rises over a gray background",
]
WAYS = ("turns", "threads", "batched")


def _requests(count: int, seconds: float):
    from vidgen.request import GenerationRequest

    return [
        GenerationRequest(prompt=PROMPTS[i % len(PROMPTS)], seconds=seconds, seed=100 + i)
        for i in range(count)
    ]


def run_way(pipe, way: str, count: int, seconds: float, lanes: int) -> dict:
    """``count`` sessions read to their end in ``way``; their frames and figures."""
    from vidgen.pipelines.session import SessionManager

    gc.collect()
    rss_before = memory_mib()[0]
    store = SessionManager(
        pipe, batch_sessions=count if way == "batched" and count > 1 else 1, batch_lanes=lanes, history_mb=0
    )
    ids = [store.open(r) for r in _requests(count, seconds)]
    frames: dict[str, list[np.ndarray]] = {sid: [] for sid in ids}
    times: dict[str, list[float]] = {sid: [] for sid in ids}
    peak = [rss_before]
    started = time.perf_counter()

    def took(sid: str, chunk) -> None:
        frames[sid].append(chunk.frames)
        times[sid].append(time.perf_counter() - started)
        peak[0] = max(peak[0], memory_mib()[0])

    if way == "turns":
        readers = {sid: store.chunks(sid) for sid in ids}
        while readers:
            for sid in list(readers):
                chunk = next(readers[sid], None)
                if chunk is None:
                    del readers[sid]
                else:
                    took(sid, chunk)
    else:

        def read(sid: str) -> None:
            for chunk in store.chunks(sid):
                took(sid, chunk)

        threads = [threading.Thread(target=read, args=(sid,)) for sid in ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    wall = time.perf_counter() - started
    stats = store.describe().get("batched")
    for sid in ids:
        store.stop(sid)
    store.close()
    gc.collect()
    trim_heap()
    rss_after = memory_mib()[0]
    fps = pipe.config.generation.fps
    video = {sid: sum(len(f) for f in frames[sid]) / fps for sid in ids}
    gaps = [b - a for sid in ids for a, b in zip(times[sid], times[sid][1:])]
    typical = statistics.median(gaps) if gaps else 0.0
    return {
        "way": way,
        "sessions": count,
        "wall_s": wall,
        "throughput": sum(video.values()) / wall,
        "rtf": [video[sid] / times[sid][-1] for sid in ids],
        "first_chunk_s": [times[sid][0] for sid in ids],
        "max_wait_over_median": max(gaps) / typical if typical else 0.0,
        "rss_mib": {"before": rss_before, "peak": peak[0], "after": rss_after},
        "batched": stats,
        "_frames": [np.concatenate(frames[sid]) for sid in ids],
    }


def run_benchmark(args: argparse.Namespace) -> dict:
    from vidgen.pipelines import LongVideoPipeline

    pipe = LongVideoPipeline.from_pretrained(args.model)
    if args.threads:  # after loading: the model's runtime.threads sets them as it loads
        torch.set_num_threads(args.threads)
    lanes = args.lanes or max(1, torch.get_num_threads())
    list(pipe.stream(PROMPTS[0], seconds=0.5, generator=0))  # warm-up: first-call costs out of the figures
    rows = []
    for count in args.sessions:
        reference = None
        for way in WAYS:
            if way != "turns" and count == 1:
                continue  # one session on one thread, nothing to batch: the turns run
            row = run_way(pipe, way, count, args.seconds, lanes)
            got = row.pop("_frames")
            if reference is None:
                reference = got
            row["max_pixel_diff"] = max(int(np.abs(a.astype(int) - b).max()) for a, b in zip(reference, got))
            rows.append(row)
            print(
                f"  {count} session(s), {way:>7}: {row['throughput']:.2f} video s per s, "
                f"slowest session {min(row['rtf']):.2f}x real time",
                flush=True,
            )
    return {"machine": machine_info(), "seconds": args.seconds, "lanes": lanes, "rows": rows}


def _row(result: dict, way: str, count: int) -> dict | None:
    return next((r for r in result["rows"] if r["way"] == way and r["sessions"] == count), None)


def format_table(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"vidgen bench sessions: {result['seconds']:g} s per session, on {m.get('gpu') or m['machine']}, "
        f"{m['threads']} CPU threads, {result['lanes']} batched forward(s) at once",
        f"{'N':>3} {'way':>8} {'video s/s':>10} {'vs turns':>9} {'slowest RTF':>12} {'1st chunk s':>12} "
        f"{'max wait':>9} {'RSS after/before':>17} {'max px diff':>12}",
    ]
    for row in result["rows"]:
        turns = _row(result, "turns", row["sessions"])
        ratio = row["throughput"] / turns["throughput"] if turns else float("nan")
        rss = row["rss_mib"]
        lines.append(
            f"{row['sessions']:>3} {row['way']:>8} {row['throughput']:>10.2f} {ratio:>8.2f}x "
            f"{min(row['rtf']):>11.2f}x {max(row['first_chunk_s']):>12.2f} "
            f"{row['max_wait_over_median']:>8.2f}x {rss['after'] / rss['before']:>16.3f} {row['max_pixel_diff']:>12}"
        )
    return "\n".join(lines)


def save_plot(result: dict, path: Path) -> None:
    from vidgen.plotting import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for way in WAYS:
        rows = [r for r in result["rows"] if r["way"] == way]
        if rows:
            ax.plot([r["sessions"] for r in rows], [r["throughput"] for r in rows], marker="o", label=way)
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("video seconds per wall second (all sessions)")
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = run_benchmark(args)
    print(format_table(result))
    path, png = out_dir / "sessions.json", out_dir / "sessions.png"
    path.write_text(json.dumps(result, indent=2))
    save_plot(result, png)
    print(f"table: {path}\nplot:  {png}")
    return 0
