"""The default model's training curve: ``vidgen eval`` figures against transformer training time.

Each point is one checkpoint's evaluation (held-out 10-s videos and storyboards) with the training
step and the wall hours the run had spent when it was saved. The points live in a JSON file kept
beside the model card, and the PNG drawn from them is what the card shows, so whether another
training stretch still pays is read off one picture.
"""

from __future__ import annotations

import json
from pathlib import Path

CURVE_FIGURES = {
    "adherence_rate": "adherence (10-s videos)",
    "frame_pass_rate": "frames passing rules 1-5",
    "shape_right_rate": "shape right (frames)",
    "changes_within_1s": "storyboard changes within 1 s",
}
"""Figures drawn, from the ``short`` table (changes from ``storyboards``)."""


def curve_point(report: dict, step: int, hours: float, note: str = "") -> dict:
    """One point from a ``vidgen eval`` report (its ``report.json``) and the checkpoint's progress."""
    short = report.get("short")
    if not short:
        raise ValueError("the report has no 'short' table: evaluate with --held-out N (10-s videos)")
    point = {"step": int(step), "hours": round(float(hours), 3), "videos": short["videos"]}
    for key in CURVE_FIGURES:
        table = report.get("storyboards", {}) if key == "changes_within_1s" else short
        value = table.get(key)
        point[key] = None if value is None else round(float(value), 4)
    if note:
        point["note"] = note
    return point


def add_point(curve_file: str | Path, point: dict) -> list[dict]:
    """Add (or replace, for the same step and hours) a point; returns the points sorted by step,
    then hours. The same step at more hours is another point: the transformer of that step with
    parts trained after it (a decoder fine-tune)."""
    path = Path(curve_file)
    points = json.loads(path.read_text()) if path.exists() else []
    key = (point["step"], point["hours"])
    points = [p for p in points if (p["step"], p["hours"]) != key] + [point]
    points.sort(key=lambda p: (p["step"], p["hours"]))
    path.write_text(json.dumps(points, indent=1) + "\n")
    return points


def plot_curve(points: list[dict], png: str | Path) -> None:
    from vidgen.plotting import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    hours = [p["hours"] for p in points]
    for key, label in CURVE_FIGURES.items():
        xs = [h for h, p in zip(hours, points) if p.get(key) is not None]
        ys = [100 * p[key] for p in points if p.get(key) is not None]
        if ys:
            ax.plot(xs, ys, marker="o", label=label)
    ax.axhline(90, color="gray", linestyle="--", linewidth=1)
    ax.text(hours[0] if hours else 0, 91, "target 90 %", fontsize=8, color="gray")
    ax.set_xlabel("transformer training, wall hours (2 shared CPU cores)")
    ax.set_ylabel("%")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center right")
    ax.set_title("Default model: vidgen eval on held-out prompts", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)
