"""The page's form read into a :class:`~vidgen.pipelines.session.GenerationRequest`.

Everything a person can type wrong is caught here, before a session opens, and reported as a
:class:`FormError` whose message names the field and says what to change. Plain Python (no
Gradio), so the rules are tested without a server.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vidgen.pipelines.session import ModelInfo, fit_warnings
from vidgen.request import GenerationRequest
from vidgen.validation import InputError

AUTO_BACKEND = "auto"
"""The attention-backend choice that lets the pipeline pick."""


class FormError(InputError):
    """A form value the model cannot use; the message says which and what to change."""


@dataclass
class Form:
    """The page's inputs, as Gradio hands them over (numbers may arrive as floats or None)."""

    prompt: str = ""
    storyboard: Any = None
    """Rows of ``(start seconds, prompt)``: a list of lists, a pandas DataFrame or Gradio's
    ``{"headers": [...], "data": [...]}``; blank rows are ignored."""
    seconds: float | None = 10.0
    until_stopped: bool = False
    seed: float | None = -1
    """-1 or None: a random seed (the request carries the one drawn, and the status shows it), as
    ``vidgen render`` without ``--seed``."""
    height: float | None = None
    width: float | None = None
    steps: float | None = None
    window_frames: float | None = None
    sink_frames: float | None = None
    anchor_stats: bool | None = None
    recache_every: float | None = None
    context_noise: float | None = None
    attention_backend: str | None = AUTO_BACKEND
    start_file: str | None = None
    """An uploaded image (image-to-video) or video (continued) the video starts from."""


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def _rows(table: Any) -> list[list[Any]]:
    if table is None:
        return []
    if hasattr(table, "values") and hasattr(table, "columns"):  # a pandas DataFrame
        return [list(r) for r in table.values.tolist()]
    if isinstance(table, dict):
        table = table.get("data") or []
    if not isinstance(table, (list, tuple)):
        raise FormError(f"the storyboard must be a table of rows (start, prompt), got {type(table).__name__}")
    return [list(r) if isinstance(r, (list, tuple)) else [r] for r in table]


def _blank(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and not value.strip()


def _seconds_of(text: Any) -> float:
    """``2``, ``2.5``, ``"2.5"``, ``"2.5 s"`` or ``"1:30"`` (minutes:seconds)."""
    if isinstance(text, bool):
        raise ValueError(text)
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        s = str(text).strip().lower().removesuffix("s").strip()
        if ":" in s:
            minutes, _, rest = s.partition(":")
            value = int(minutes) * 60 + float(rest)
        else:
            value = float(s)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def parse_storyboard(table: Any) -> list[tuple[float, str]]:
    """Storyboard rows as ``[(start_seconds, prompt), ...]``, checked: every row has a start that
    is a number of seconds >= 0 and a prompt, and starts increase from row to row."""
    board: list[tuple[float, str]] = []
    for number, row in enumerate(_rows(table), start=1):
        start, prompt = (row + [None, None])[:2]
        if _blank(start) and _blank(prompt):
            continue
        if _blank(prompt):
            raise FormError(f"storyboard row {number} has no prompt")
        if _blank(start):
            raise FormError(f"storyboard row {number} has no start time (seconds)")
        try:
            seconds = _seconds_of(start)
        except (TypeError, ValueError):
            raise FormError(
                f"storyboard row {number}: start {str(start)!r} is not a time; write seconds, e.g. 2.5"
            ) from None
        if seconds < 0:
            raise FormError(f"storyboard row {number} starts at {seconds:g} s; times start at 0")
        if board and seconds <= board[-1][0]:
            raise FormError(
                f"storyboard row {number} starts at {seconds:g} s, not after row {number - 1} "
                f"({board[-1][0]:g} s): put the rows in order of time"
            )
        board.append((seconds, str(prompt).strip()))
    return board


def _number(name: str, value: Any, default: float) -> float:
    # an emptied field arrives as None or ""; NaN is a value sent through the API, not a blank
    if value is None or isinstance(value, str) and not value.strip():
        return default
    if isinstance(value, bool):
        raise FormError(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise FormError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise FormError(f"{name} must be a finite number, got {value!r}")
    return number


def _integer(name: str, value: Any, default: int, minimum: int | None = None) -> int:
    number = _number(name, value, default)
    if number != int(number):
        raise FormError(f"{name} must be a whole number, got {number:g}")
    if minimum is not None and number < minimum:
        raise FormError(f"{name} must be at least {minimum}, got {number:g}")
    return int(number)


def build_request(form: Form, info: ModelInfo) -> tuple[GenerationRequest, list[str]]:
    """The request the form asks for, and warnings about parts of it that will have no effect.

    The prompt starts the video; storyboard rows change it at their start times (a storyboard
    whose first row starts at 0 s may replace the prompt). Raises :class:`FormError`.
    """
    g, d = info.config.generation, info.config.drift
    # 1. what the video shows
    prompt = (form.prompt or "").strip()
    rows = parse_storyboard(form.storyboard)
    if prompt and rows and rows[0][0] == 0:
        raise FormError(
            "storyboard row 1 starts at 0 s, where the prompt starts: start it later, or clear the prompt"
        )
    if not prompt and not rows:
        raise FormError("the prompt is empty: describe the video (or fill in the storyboard)")
    if not prompt and rows[0][0] != 0:
        raise FormError(
            f"the prompt is empty and the storyboard starts at {rows[0][0]:g} s: "
            "type a prompt for the opening, or start row 1 at 0"
        )
    board = ([(0.0, prompt)] if prompt else []) + rows

    # 2. how long
    warnings: list[str] = []
    if form.until_stopped:
        seconds = None
    else:
        seconds = _number("seconds", form.seconds, 10.0)
        if seconds <= 0 or seconds > g.max_seconds:
            raise FormError(
                f"seconds must be above 0 and at most {g.max_seconds:g}, got {seconds:g} "
                "(or tick 'until stopped')"
            )
        late = [i for i, (start, _) in enumerate(rows, start=1) if start >= seconds]
        if late:
            warnings.append(
                f"storyboard row {late[0]} starts at {rows[late[0] - 1][0]:g} s, after the video ends "
                f"({seconds:g} s): it will not be shown"
            )

    # 3. how it is sampled
    seed = _integer("seed", form.seed, -1, minimum=-1)
    if seed == -1:
        seed = random.randrange(2**31 - 1)
    height = _integer("height", form.height, g.height)
    width = _integer("width", form.width, g.width)
    steps = _integer("steps", form.steps, g.num_inference_steps, minimum=1)
    try:
        info.check_size(height, width)
        info.check_steps(steps)
    except InputError as err:
        raise FormError(str(err)) from None
    warnings += fit_warnings(info.config, [text for _, text in board], height, width)

    # 4. advanced: per-request config overrides, validated like a config file
    backend = str(form.attention_backend or AUTO_BACKEND).strip()
    if backend != AUTO_BACKEND and info.attention_backends and backend not in info.attention_backends:
        raise FormError(
            f"attention backend {backend!r} cannot run here; choose {AUTO_BACKEND} or one of "
            f"{', '.join(info.attention_backends)}"
        )
    overrides = {
        "generation.window_frames": _integer("window frames", form.window_frames, g.window_frames, 0),
        "generation.sink_frames": _integer("sink frames", form.sink_frames, g.sink_frames, 0),
        "generation.addnoise_condition": _number("context noise", form.context_noise, g.addnoise_condition),
        "drift.anchor_stats": d.anchor_stats if form.anchor_stats is None else bool(form.anchor_stats),
        "drift.recache_every": _integer("re-cache every", form.recache_every, d.recache_every, 0),
        "runtime.attention_backend": "" if backend == AUTO_BACKEND else backend,
    }
    try:
        info.check_overrides(overrides)
    except InputError as err:
        raise FormError(str(err)) from None
    changed = {k: v for k, v in overrides.items() if _get(info, k) != v}

    # 5. an uploaded start: read now, so that a file that is no image or video is a form error
    start = _start(form.start_file, height, width, warnings)

    request = GenerationRequest(
        prompt=board[0][1] if len(board) == 1 else None,
        storyboard=board if len(board) > 1 else None,
        seconds=seconds,
        height=height,
        width=width,
        num_inference_steps=steps,
        seed=seed,
        overrides=changed,
        **start,
    )
    return request, warnings


def _start(path: Any, height: int, width: int, warnings: list[str]) -> dict[str, str]:
    if _blank(path):
        return {}
    from vidgen.video.reading import probe_start

    path = str(path)
    kind = "image" if Path(path).suffix.lower() in IMAGE_SUFFIXES else "video"
    try:  # the header and packets only: an image too large to decode is refused before decoding
        found = probe_start(**{kind: path})
    except InputError as err:
        message = str(err).split(": ", 1)[-1].replace(path, Path(path).name)  # not the server's folders
        if "holds no frames" in message:
            raise FormError("the uploaded video holds no frames: upload another, or remove it") from None
        raise FormError(f"the uploaded file cannot be used: {message}") from None
    assert found is not None  # a path was given
    _, found_height, found_width = found
    if (found_height, found_width) != (height, width):
        warnings.append(
            f"the uploaded {kind} is {found_width}x{found_height}: it is stretched to {width}x{height}"
        )
    return {kind: path}


def _get(info: ModelInfo, dotted: str) -> Any:
    table, _, key = dotted.partition(".")
    return getattr(getattr(info.config, table), key)
