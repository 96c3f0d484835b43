"""The Shapes World evaluator: does a video show what its prompt (or storyboard) asked, and
does it keep showing it?

Implements the spec's "The evaluator" section: per-frame rules 1-5 (measured by
``vidgen.shapes.measure``), rules 6-8 on the motion (``vidgen.shapes.motion``), adherence, the
drift-free rate over 10-second windows, and for storyboards how soon each change shows.
Deterministic. Where the spec is silent, it decides as follows.

- Windows. 1-second windows partition each caption's stretch of video from its first frame;
  a remainder shorter than a second joins the stretch's last window (so a stretch shorter
  than a second is one window). 10-second windows partition the whole video the same way; a
  1-second window counts in the 10-second window holding its first frame.
- Displacement of frame t = centroid[t] - centroid[t-1]; it belongs to frame t's window.
  Rule 6's speed is its length. Frames without an object have no centroid, so no displacement.
- Rule 7 reads the displacements through rule 8's 5-frame moving average (the median of the
  averages over the second): at some canvas sizes (e.g. S = 72 or 100) a slow object's mask
  moves in whole-pixel steps about every other frame, and the median of the raw steps is 0.
- Rule 8. A reversal is two consecutive averages of at least 0.002 S per frame (smaller ones
  in between are skipped) with opposite signs on an axis. It turns at the frame of the
  extreme centroid between the two and falls in that frame's window. The wall is the one the
  motion was heading for; the extent is the mask's bounding box at the turning frame.
- Storyboards. A change at t seconds starts at frame ceil(16 t); a caption that names a
  direction different from the previous caption's (or names one after a caption that named
  none) is a new direction. In the first second after a change (the transition the spec
  allows) a frame passes rules 1-5 if it shows the previous caption or the new one, and rule
  6 asks for the slower of the two speeds. When a change alters the direction, shape or size,
  moving averages over its transition second are skipped by rule 8 and turns made between a
  frame before the change and a second after it are excused (turning is what a new
  direction does; a new shape or size moves the centroid within the object).
- Change latency. A change takes effect at the first frame f from the change on such that
  frame f and at least 90% of the second from f pass rules 1-5 against the new caption and,
  for a new direction, the mean of the next 5 displacements shows it on each axis (the named
  sign; under 0.002 S on an axis the direction does not move along). An axis is free while
  the object is within the bounce zone (half its extent + 0.08 S) of the wall the named
  direction heads for: it may just have bounced off it. Speed is left to rule 6. The latency
  is (f - change frame) / fps, within 1 s when at most fps frames.
- Rule 7 is judged over the first second of the video when its caption names a direction,
  and after each new direction over the second that starts where the change took effect (or
  a second after the change, if it had not by then); the displacements judged are those
  after that second's first frame. An axis is not judged when a reversal turns within the
  second, or, after a change, when the object is in the named wall's bounce zone in the first
  half of the second (a bounce too close to the change for the moving average to show).
- A video adheres when rules 1-5 and 6 + 8 pass the 90% rules, rule 7 holds, and every
  change took effect within 1 s. It is drift-free when at least 95% of its 10-second windows
  pass 1-6 and 8 by the 90% rules and rule 7 holds.
- At a frame rate other than 16, per-frame speeds and the 0.002 S threshold scale by 16 / fps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from vidgen.shapes.measure import FrameMeasurements, measure_frames
from vidgen.shapes.motion import (
    MIN_SPEED_RATIO,
    STILL,
    Reversal,
    bounce_zones,
    direction_shown,
    displacements,
    excuse,
    find_reversals,
    judge_direction,
    median_speed,
)
from vidgen.shapes.prompts import PromptSpec, parse_prompt
from vidgen.shapes.world import (
    ATTRIBUTES,
    BACKGROUNDS,
    COLORS,
    FPS,
    SHAPES,
    SIZES,
    SPEEDS,
    Scene,
    shape_area,
    storyboard_frames,
)

BACKGROUND_TOLERANCE = 40.0
"""Rule 1: the largest RGB distance between the measured and the named background."""
AREA_RANGE = (0.5, 1.8)
"""Rule 3: allowed mask area as multiples of the named shape's area."""
PASS_RATE = 0.9
"""Share of frames and of 1-second windows that must pass."""
DRIFT_FREE_RATE = 0.95
"""Share of 10-second windows that must pass for a long video to be drift-free."""
LONG_WINDOW_SECONDS = 10

FRAME_REASONS = ("background", "no_object", "color", "area", "shape")
"""Why a frame fails, in the order the rules are checked."""

Prompt = str | PromptSpec | Scene
PromptOrStoryboard = Prompt | Sequence[tuple[float, Prompt]]


@dataclass(frozen=True)
class FrameRecord:
    """One frame against rules 1-5."""

    index: int
    caption: int
    """Index of the caption the frame was judged against (in a change's first second, the
    previous one when the frame still shows it)."""
    passed: bool
    reason: str | None
    """The first rule that failed, one of ``FRAME_REASONS``; None when it passed."""
    background: tuple[float, float, float]
    object_color: tuple[float, float, float] | None
    color: str | None
    """Nearest table colour to ``object_color``."""
    area: float
    """Mask area, fraction of S^2."""
    shape: str | None
    centroid: tuple[float, float] | None
    """Mask centroid ``(x, y)``, fractions of S."""


@dataclass(frozen=True)
class WindowRecord:
    """One 1-second window against rules 6 and 8."""

    start: int
    stop: int
    caption: int
    median_speed: float
    """Median centroid speed, fraction of S per frame; NaN when no displacement was measured."""
    required_speed: float
    motion_ok: bool
    reversals: tuple[Reversal, ...]
    reversal_ok: bool

    @property
    def passed(self) -> bool:
        return self.motion_ok and self.reversal_ok


@dataclass(frozen=True)
class SegmentRecord:
    """One caption's stretch of video: rule 7 and, after a change, the change latency."""

    index: int
    start: int
    stop: int
    spec: PromptSpec
    changed: tuple[str, ...]
    """Attributes the caption changes from the previous one (empty for the first)."""
    effect_frame: int | None
    """Where the change took effect (0 for the first caption); None if it never did."""
    latency: float | None
    """Seconds from the change to ``effect_frame``; None for the first caption or never."""
    within_one_second: bool | None
    """Whether the change took effect within 1 s; None for the first caption."""
    direction_window: tuple[int, int] | None
    """Frames over which rule 7 was judged; None when it was not."""
    median_displacement: tuple[float, float] | None
    axes_judged: tuple[bool, bool] | None
    direction_ok: bool | None
    """Rule 7; None when not judged (no direction named, or none newly named)."""


@dataclass(frozen=True)
class LongWindowRecord:
    """One 10-second window against rules 1-6 and 8 by the 90% rules."""

    start: int
    stop: int
    frame_pass_rate: float
    window_pass_rate: float

    @property
    def passed(self) -> bool:
        return self.frame_pass_rate >= PASS_RATE and self.window_pass_rate >= PASS_RATE


@dataclass
class VideoReport:
    """Everything ``evaluate_video`` found; ``adheres`` and ``drift_free`` are the verdicts."""

    num_frames: int
    fps: int
    size: int
    frames: list[FrameRecord]
    windows: list[WindowRecord]
    segments: list[SegmentRecord]
    reversals: list[Reversal]
    drift_free_windows: list[LongWindowRecord]
    frame_pass_rate: float
    window_pass_rate: float
    direction_ok: bool
    changes_ok: bool
    adheres: bool
    drift_free_rate: float
    drift_free: bool
    shape_right_rate: float
    """Share of frames whose object has the shape their caption names (rule 4 alone; a frame with
    no object counts as wrong): the figure that shows whether a model learned shape at all."""
    failures: dict[str, int]
    """Counts of failed frames by first reason, failed windows by check ("motion",
    "reversal"), captions failing rule 7 ("direction"), and late changes ("change_latency")."""
    measurements: FrameMeasurements = field(repr=False)

    @property
    def change_latencies(self) -> list[float | None]:
        """Latency in seconds of each change (None where it never took effect)."""
        return [s.latency for s in self.segments[1:]]


def evaluate_video(frames: np.ndarray, prompt: PromptOrStoryboard, fps: int = FPS) -> VideoReport:
    """Judge a ``(T, S, S, 3)`` uint8 video against a prompt or a storyboard.

    ``prompt`` is a caption, a ``PromptSpec``, a ``Scene``, or a storyboard
    ``[(start_seconds, caption | PromptSpec | Scene), ...]`` starting at 0. Captions starting
    after the video's end are ignored.
    """
    # 1. check inputs; the captions and where they start
    if fps < 1:
        raise ValueError(f"fps must be >= 1, got {fps}")
    timeline = _Timeline.build(_as_storyboard(prompt), len(frames), fps)

    # 2. measure every frame (rules 1-5 need no caption to measure)
    m = measure_frames(frames)

    # 3. rules 1-5, per frame
    codes, judged_by, shows_new = _judge_frames(m, timeline)

    # 4. the motion: displacements, reversals (rule 8), bounce zones
    steps = displacements(m.centroid)
    in_transition = np.zeros(len(m), dtype=bool)
    for change in timeline.transitions:
        in_transition[change : change + fps] = True
    reversals = [
        excuse(r, timeline.transitions, fps)
        for r in find_reversals(m.centroid, m.extent, steps, timeline.still, in_transition)
    ]
    zones = bounce_zones(m.centroid, m.extent)

    # 5. 1-second windows (rules 6 and 8)
    windows = _one_second_windows(timeline, steps, reversals)

    # 6. each caption: change latency and direction (rule 7)
    segments = [_segment(timeline, k, shows_new, steps, reversals, zones) for k in range(len(timeline.specs))]

    # 7. 10-second windows (drift)
    frame_ok = codes == 0
    long_windows = _ten_second_windows(frame_ok, windows, fps)

    # 8. verdicts
    frame_pass_rate = float(frame_ok.mean())
    window_pass_rate = float(np.mean([w.passed for w in windows]))
    direction_ok = all(s.direction_ok is not False for s in segments)
    changes_ok = all(s.within_one_second for s in segments[1:])
    drift_free_rate = float(np.mean([w.passed for w in long_windows]))
    named_shape = np.array([SHAPES.index(timeline.specs[k].shape) for k in judged_by])
    shape_right_rate = float(np.mean(m.shape_index == named_shape))
    failures = Counter(FRAME_REASONS[c - 1] for c in codes[codes > 0].tolist())
    failures.update(
        motion=sum(not w.motion_ok for w in windows),
        reversal=sum(not w.reversal_ok for w in windows),
        direction=sum(s.direction_ok is False for s in segments),
        change_latency=sum(s.within_one_second is False for s in segments),
    )
    return VideoReport(
        num_frames=len(m),
        fps=fps,
        size=m.size,
        frames=_frame_records(m, codes, judged_by),
        windows=windows,
        segments=segments,
        reversals=reversals,
        drift_free_windows=long_windows,
        frame_pass_rate=frame_pass_rate,
        window_pass_rate=window_pass_rate,
        direction_ok=direction_ok,
        changes_ok=changes_ok,
        adheres=min(frame_pass_rate, window_pass_rate) >= PASS_RATE and direction_ok and changes_ok,
        drift_free_rate=drift_free_rate,
        drift_free=drift_free_rate >= DRIFT_FREE_RATE and direction_ok,
        shape_right_rate=shape_right_rate,
        failures={reason: count for reason, count in failures.items() if count},
        measurements=m,
    )


def summarize(reports: Sequence[VideoReport]) -> dict[str, float | int | dict[str, int]]:
    """Aggregate rates over many reports: means over videos, latencies over changes."""
    if not reports:
        raise ValueError("summarize needs at least one report")
    changes = [s for r in reports for s in r.segments[1:]]
    latencies = [s.latency for s in changes if s.latency is not None]
    failures: Counter[str] = Counter()
    for r in reports:
        failures.update(r.failures)
    nan = float("nan")
    return {
        "videos": len(reports),
        "adherence_rate": float(np.mean([r.adheres for r in reports])),
        "frame_pass_rate": float(np.mean([r.frame_pass_rate for r in reports])),
        "window_pass_rate": float(np.mean([r.window_pass_rate for r in reports])),
        "direction_ok_rate": float(np.mean([r.direction_ok for r in reports])),
        "drift_free_rate": float(np.mean([r.drift_free_rate for r in reports])),
        "drift_free_video_rate": float(np.mean([r.drift_free for r in reports])),
        "shape_right_rate": float(np.mean([r.shape_right_rate for r in reports])),
        "changes": len(changes),
        "change_within_1s_rate": float(np.mean([bool(s.within_one_second) for s in changes]))
        if changes
        else nan,
        "mean_change_latency": float(np.mean(latencies)) if latencies else nan,
        "failures": dict(sorted(failures.items())),
    }


# -- steps of evaluate_video ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Timeline:
    """The captions of a video, where each starts and stops, and the units of its motion."""

    specs: list[PromptSpec]
    starts: list[int]
    stops: list[int]
    changed: list[tuple[str, ...]]
    """Attributes each caption changes from the previous one (empty for the first)."""
    fps: int
    scale: float
    """The spec's per-frame speeds are per frame at 16 fps: multiply by this at ``fps``."""
    still: float

    @classmethod
    def build(cls, storyboard: list[tuple[float, PromptSpec]], num_frames: int, fps: int) -> _Timeline:
        starts = [s for s in storyboard_frames(storyboard, fps) if s < max(num_frames, 1)]
        specs = [spec for _, spec in storyboard[: len(starts)]]
        changed = [()] + [
            tuple(a for a in ATTRIBUTES if getattr(o, a) != getattr(n, a)) for o, n in pairwise(specs)
        ]
        scale = FPS / fps
        return cls(specs, starts, [*starts[1:], num_frames], changed, fps, scale, STILL * scale)

    @property
    def transitions(self) -> list[int]:
        """Changes that alter the direction, shape or size: the centroid may turn or jump."""
        moving = {"direction", "shape", "size"}
        return [
            start for start, changed in zip(self.starts, self.changed, strict=True) if moving & set(changed)
        ]

    def new_direction(self, k: int) -> bool:
        return k > 0 and "direction" in self.changed[k] and self.specs[k].direction is not None

    def required_speed(self, k: int, first_window: bool) -> float:
        """Rule 6's minimum median speed in caption k (in its first second: the slower speed)."""
        names = [self.specs[k].named_speed] + ([self.specs[k - 1].named_speed] if first_window and k else [])
        return MIN_SPEED_RATIO * min(SPEEDS[n] for n in names) * self.scale


def _judge_frames(m: FrameMeasurements, timeline: _Timeline) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rules 1-5: per frame a code (0 pass, else 1 + index in ``FRAME_REASONS``), the caption it
    was judged against, and whether it shows its own caption."""
    codes = np.zeros(len(m), dtype=np.int64)
    judged_by = np.zeros(len(m), dtype=np.int64)
    shows_new = np.zeros(len(m), dtype=bool)
    for k, (start, stop) in enumerate(zip(timeline.starts, timeline.stops, strict=True)):
        codes[start:stop] = _frame_codes(m, timeline.specs[k], start, stop)
        judged_by[start:stop] = k
        shows_new[start:stop] = codes[start:stop] == 0
        if k > 0:  # in the change's first second, showing the previous caption passes too
            end = min(start + timeline.fps, stop)
            old_ok = _frame_codes(m, timeline.specs[k - 1], start, end) == 0
            judged_by[start:end][old_ok & (codes[start:end] != 0)] = k - 1
            codes[start:end][old_ok] = 0
    return codes, judged_by, shows_new


def _frame_codes(m: FrameMeasurements, spec: PromptSpec, start: int, stop: int) -> np.ndarray:
    """0 where a frame of [start, stop) passes rules 1-5 against ``spec``, else 1 + the first
    failed rule's index in ``FRAME_REASONS``."""
    s = slice(start, stop)
    named = np.array(BACKGROUNDS[spec.background], dtype=np.float64)
    background_ok = np.linalg.norm(m.background[s] - named, axis=1) <= BACKGROUND_TOLERANCE
    color_ok = m.color_index[s] == list(COLORS).index(spec.color)
    if spec.size is not None:
        low = high = shape_area(spec.shape, SIZES[spec.size])
    else:
        low, high = shape_area(spec.shape, min(SIZES.values())), shape_area(spec.shape, max(SIZES.values()))
    area_ok = (m.area[s] >= AREA_RANGE[0] * low) & (m.area[s] <= AREA_RANGE[1] * high)
    shape_ok = m.shape_index[s] == SHAPES.index(spec.shape)
    codes = np.zeros(stop - start, dtype=np.int64)
    checks = (background_ok, m.has_object[s], color_ok, area_ok, shape_ok)
    for code in range(len(checks), 0, -1):  # the last rule first, so the first failure stays
        codes[~checks[code - 1]] = code
    return codes


def _partition(start: int, stop: int, length: int) -> list[int]:
    """Window bounds from ``start``: windows of ``length`` frames, the remainder joining the last."""
    count = max(1, (stop - start) // length)
    return [start + i * length for i in range(count)] + [stop]


def _one_second_windows(
    timeline: _Timeline, steps: np.ndarray, reversals: list[Reversal]
) -> list[WindowRecord]:
    turns = np.array([r.frame for r in reversals], dtype=np.int64)
    windows = []
    for k, (start, stop) in enumerate(zip(timeline.starts, timeline.stops, strict=True)):
        for w0, w1 in pairwise(_partition(start, stop, timeline.fps)):
            speed = median_speed(steps[w0:w1])
            required = timeline.required_speed(k, first_window=w0 == start)
            inside = tuple(reversals[i] for i in np.flatnonzero((turns >= w0) & (turns < w1)))
            windows.append(
                WindowRecord(
                    start=w0,
                    stop=w1,
                    caption=k,
                    median_speed=speed,
                    required_speed=required,
                    motion_ok=bool(speed >= required),
                    reversals=inside,
                    reversal_ok=all(r.ok for r in inside),
                )
            )
    return windows


def _segment(
    timeline: _Timeline,
    k: int,
    shows_new: np.ndarray,
    steps: np.ndarray,
    reversals: list[Reversal],
    zones: dict[int, np.ndarray],
) -> SegmentRecord:
    """Caption k: when its change took effect, and rule 7 where it names a (new) direction."""
    spec, start, stop, fps = timeline.specs[k], timeline.starts[k], timeline.stops[k], timeline.fps
    if k == 0:
        effect, judge, w0 = 0, spec.direction is not None, 0
    else:
        judge = timeline.new_direction(k)
        ready = _sustained(shows_new[start:stop], fps)
        if judge:
            local_zones = {sign: zone[start:stop] for sign, zone in zones.items()}
            ready &= direction_shown(spec.direction, steps[start:stop], local_zones, timeline.still)
        effect = start + int(np.argmax(ready)) if ready.any() else None
        w0 = effect if effect is not None and effect - start <= fps else start + fps
    rule_7 = dict.fromkeys(("direction_window", "median_displacement", "axes_judged", "direction_ok"))
    if judge:
        after_change = zones if k > 0 else None
        rule_7 = judge_direction(
            spec.direction, steps, (w0, min(w0 + fps, stop)), reversals, after_change, timeline.still
        )
    latency = None if k == 0 or effect is None else (effect - start) / fps
    return SegmentRecord(
        index=k,
        start=start,
        stop=stop,
        spec=spec,
        changed=timeline.changed[k],
        effect_frame=effect,
        latency=latency,
        within_one_second=None if k == 0 else latency is not None and latency <= 1.0,
        **rule_7,
    )


def _sustained(ok: np.ndarray, fps: int) -> np.ndarray:
    """Whether frame f passes and at least 90% of frames f .. f + fps - 1 (within ``ok``) do."""
    total = np.concatenate([[0], np.cumsum(ok)])
    first = np.arange(len(ok))
    last = np.minimum(first + fps, len(ok))
    return ok & ((total[last] - total[first]) >= PASS_RATE * (last - first))


def _ten_second_windows(
    frame_ok: np.ndarray, windows: list[WindowRecord], fps: int
) -> list[LongWindowRecord]:
    window_ok = np.array([w.passed for w in windows])
    window_starts = np.array([w.start for w in windows])
    records = []
    for w0, w1 in pairwise(_partition(0, len(frame_ok), LONG_WINDOW_SECONDS * fps)):
        inside = (window_starts >= w0) & (window_starts < w1)
        records.append(
            LongWindowRecord(
                start=w0,
                stop=w1,
                frame_pass_rate=float(frame_ok[w0:w1].mean()),
                window_pass_rate=float(window_ok[inside].mean()) if inside.any() else 1.0,
            )
        )
    return records


def _as_spec(prompt: Prompt) -> PromptSpec:
    if isinstance(prompt, PromptSpec):
        return prompt
    if isinstance(prompt, Scene):
        return PromptSpec.from_scene(prompt)
    if isinstance(prompt, str):
        return parse_prompt(prompt)
    raise TypeError(f"a prompt is a str, PromptSpec or Scene, got {type(prompt).__name__}")


def _as_storyboard(prompt: PromptOrStoryboard) -> list[tuple[float, PromptSpec]]:
    if isinstance(prompt, (str, PromptSpec, Scene)):
        return [(0.0, _as_spec(prompt))]
    entries = list(prompt)
    for entry in entries:
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise TypeError(f"storyboard entries must be (start_seconds, caption) pairs, got {entry!r}")
    return [(float(t), _as_spec(p)) for t, p in entries]


def _frame_records(m: FrameMeasurements, codes: np.ndarray, judged_by: np.ndarray) -> list[FrameRecord]:
    colors, shapes = list(COLORS), SHAPES
    present = m.has_object.tolist()
    records = []
    for t, (code, caption, background, color, color_index, area, shape_index, centroid) in enumerate(
        zip(
            codes.tolist(),
            judged_by.tolist(),
            m.background.tolist(),
            m.object_color.tolist(),
            m.color_index.tolist(),
            m.area.tolist(),
            m.shape_index.tolist(),
            m.centroid.tolist(),
            strict=True,
        )
    ):
        has_color = color_index >= 0
        records.append(
            FrameRecord(
                index=t,
                caption=caption,
                passed=code == 0,
                reason=FRAME_REASONS[code - 1] if code else None,
                background=tuple(background),
                object_color=tuple(color) if has_color else None,
                color=colors[color_index] if has_color else None,
                area=area,
                shape=shapes[shape_index] if present[t] else None,
                centroid=tuple(centroid) if present[t] else None,
            )
        )
    return records
