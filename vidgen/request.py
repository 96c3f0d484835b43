"""One video asked for: :class:`GenerationRequest`, the request every surface translates its input into.

The Python API, ``vidgen render`` (one video, or a line of a jobs file, in this process or on Ray),
the Gradio page and the sessions (in process or on Ray Serve) each build a request from what they
were given, :meth:`~GenerationRequest.validate` it (one set of checks, each message naming the
argument as that surface calls it), and run it with :meth:`~GenerationRequest.stream_kwargs`, the
one mapping into ``LongVideoPipeline.stream``. A request round-trips through JSON
(:meth:`~GenerationRequest.to_json`), which is how resumable renders and persisted sessions keep it.

Light on purpose (no torch): the CLI checks a request before its heavy imports. What depends on the
model (sizes it can make, the config's limits, the memory a size needs) is checked by the pipeline
(``LongVideoPipeline.check_inputs``), which takes the same arguments.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vidgen.validation import (
    MAX_INT,
    InputError,
    check_guidance,
    check_number,
    check_seed,
    check_text,
    is_blank,
    parse_json,
)

Storyboard = list[tuple[float, str]]


@dataclass
class GenerationRequest:
    """Everything that decides one video's frames, apart from the pipeline it runs on.

    The pipeline (weights, preset or config file, LoRAs, quantization, device: what ``vidgen
    render --model / --config / --lora / --quantize / --set`` choose) is not part of a request: a
    pipeline is loaded once and runs many requests, on a server for many clients, and each surface
    knows its own. What may change from one video to the next on one loaded pipeline is here,
    per-video config changes included (``overrides``: window, sinks, drift, attention backend).
    """

    prompt: str | None = None
    """What the video shows (give this or ``storyboard``)."""
    storyboard: Storyboard | None = None
    """``[(start_seconds, prompt), ...]``: timed prompts, the first at 0 s, times increasing."""
    seconds: float | None = None
    """Length of the generated part; None: until stopped (sessions and ``stream`` only)."""
    height: int | None = None
    """Frame height in pixels (None: the model's)."""
    width: int | None = None
    """Frame width in pixels (None: the model's)."""
    num_inference_steps: int | None = None
    """Sampler steps per chunk (None: the model's)."""
    guidance_scale: float | None = None
    """Classifier-free guidance scale, 1: off (None: the model's)."""
    negative_prompt: str | None = None
    """What guidance steers away from (None: the config's ``generation.negative_prompt``)."""
    seed: int | None = None
    """None: a random seed (a surface that must make the video again draws it and sets it here)."""
    fps: int | None = None
    """Frames per second (None: the model's); the same as ``overrides["generation.fps"]``."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """``"table.key": value`` config changes for this video (window, sinks, drift, backend)."""
    image: str | None = None
    """Image-to-video: an image file (readable where the video is made) the video starts from."""
    video: str | None = None
    """Continuation: a video file continued; the video opens with its frames, and ``seconds``
    counts the frames made after them."""

    # ------------------------------------------------------------------ checks
    def validate(self, names: Mapping[str, str] | None = None, *, what: bool = True) -> GenerationRequest:
        """``self`` if every field can work for some model, else :class:`InputError`. ``names``:
        how the surface calls a field in its messages (``{"num_inference_steps": "--steps"}``;
        the field's name otherwise). ``what=False``: the prompt and storyboard are not checked (the
        defaults of a jobs file, whose lines say what each video shows)."""

        def name(key: str) -> str:
            return (names or {}).get(key, key)

        if what:
            prompt_changes(self.prompt, self.storyboard, names)
        if self.seconds is not None:
            check_number(name("seconds"), self.seconds, positive=True)
        for key in ("height", "width", "num_inference_steps", "fps"):
            value = getattr(self, key)
            if value is not None:
                check_number(name(key), value, integer=True, positive=True, maximum=MAX_INT)
        if self.guidance_scale is not None:
            check_guidance(name("guidance_scale"), self.guidance_scale)
        if self.seed is not None:
            check_seed(name("seed"), self.seed)
        if self.negative_prompt is not None:
            check_text(name("negative_prompt"), self.negative_prompt)
        if not isinstance(self.overrides, dict) or not all(
            isinstance(k, str) and "." in k for k in self.overrides
        ):
            raise InputError(
                f"{name('overrides')} must map 'table.key' names to values, got {self.overrides!r}"
            )
        if self.image is not None and self.video is not None:
            raise InputError(f"pass {name('image')} or {name('video')}, not both")
        for key in ("image", "video"):
            path = getattr(self, key)
            if path is not None and not (check_text(name(key), path) and path.strip()):
                raise InputError(f"{name(key)} is empty: name the file to start from")
        return self

    # ------------------------------------------------------------------ running it
    @property
    def start(self) -> str | None:
        """The file the video starts from (``image`` or ``video``), if any."""
        return self.image or self.video

    def prompts(self) -> list[str]:
        """Every prompt the video shows, in order."""
        return [p for _, p in self.storyboard] if self.storyboard is not None else [self.prompt or ""]

    def config_overrides(self) -> dict[str, Any]:
        """The config changes this video makes (``overrides`` and ``fps``)."""
        return {**self.overrides, **({"generation.fps": self.fps} if self.fps is not None else {})}

    def num_frames(self, fps: int) -> int | None:
        """Frames generated at ``fps`` (None: until stopped), as ``LongVideoPipeline.stream`` counts them."""
        return None if self.seconds is None else max(1, round(self.seconds * fps))

    def stream_kwargs(self) -> dict[str, Any]:
        """The arguments of ``LongVideoPipeline.stream`` (and ``check_inputs``) that make this video:
        the one mapping every surface runs a request with. A start file opens the video
        (``include_input``): its frames come first and every ``frame_start`` counts them."""
        return {
            "prompt": self.prompt,
            "storyboard": [tuple(e) for e in self.storyboard] if self.storyboard is not None else None,
            "seconds": self.seconds,
            "height": self.height,
            "width": self.width,
            "num_inference_steps": self.num_inference_steps,
            "guidance_scale": self.guidance_scale,
            "negative_prompt": self.negative_prompt,
            "generator": self.seed,
            "overrides": self.config_overrides() or None,
            "image": self.image,
            "video": self.video,
            "include_input": self.start is not None,
        }

    def with_absolute_paths(self) -> GenerationRequest:
        """A copy whose start file is an absolute path (workers may run in another folder)."""

        def absolute(path: str | None) -> str | None:
            return str(Path(path).expanduser().resolve()) if path else path

        return dataclasses.replace(self, image=absolute(self.image), video=absolute(self.video))

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (a storyboard as ``[[start, prompt], ...]``)."""
        data = dataclasses.asdict(self)
        if self.storyboard is not None:
            data["storyboard"] = [[float(t), p] for t, p in self.storyboard]
        data["overrides"] = dict(self.overrides)
        return data

    @classmethod
    def from_dict(cls, data: Any, source: str = "request") -> GenerationRequest:
        """The request :meth:`to_dict` wrote, validated; a key it does not know is an
        :class:`InputError` naming it."""
        if not isinstance(data, dict):
            raise InputError(f"{source} must be a JSON object, got {type(data).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise InputError(f"{source}: unknown key {unknown[0]!r} (known: {', '.join(known)})")
        values = dict(data)
        board = values.get("storyboard")
        if isinstance(board, list):
            values["storyboard"] = [tuple(e) if isinstance(e, list) else e for e in board]
        if values.get("overrides") is None:
            values["overrides"] = {}
        return cls(**values).validate()

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str, source: str = "request") -> GenerationRequest:
        return cls.from_dict(parse_json(text, source), source)


def prompt_changes(prompt: Any, storyboard: Any, names: Mapping[str, str] | None = None) -> Storyboard:
    """The video's prompts as ``[(start_seconds, prompt), ...]`` (a prompt starts at 0 s), stripped;
    exactly one of ``prompt`` and ``storyboard``, every text UTF-8 and not empty, times finite,
    starting at 0 and increasing, else :class:`InputError`. ``names``: as in
    :meth:`GenerationRequest.validate`."""
    names = names or {}
    if (prompt is None) == (storyboard is None):
        raise InputError(
            f"pass exactly one of {names.get('prompt', 'prompt=')} or {names.get('storyboard', 'storyboard=')}"
        )
    prompt_name, storyboard_name = names.get("prompt", "the prompt"), names.get("storyboard", "storyboard=")
    if storyboard is None:
        if is_blank(check_text(prompt_name, prompt)):
            raise InputError(f"{prompt_name} is empty: say what the video shows")
        return [(0.0, prompt.strip())]
    if not isinstance(storyboard, (list, tuple)) or not storyboard:
        raise InputError(f"{storyboard_name} must be a non-empty list of (start_seconds, prompt)")
    board: Storyboard = []
    for i, entry in enumerate(storyboard):
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise InputError(f"storyboard entry {i} must be (start_seconds, prompt), got {entry!r}")
        start = float(check_number(f"storyboard entry {i} start", entry[0], minimum=0))
        text = check_text(f"storyboard entry {i} prompt", entry[1])
        if is_blank(text):
            raise InputError(f"storyboard entry {i} has an empty prompt")
        if board and start <= board[-1][0]:
            raise InputError(
                f"storyboard times must increase: entry {i} starts at {start} s after {board[-1][0]} s"
            )
        board.append((start, text.strip()))
    if board[0][0] != 0:
        raise InputError(f"a storyboard starts at 0 s, the first entry starts at {board[0][0]} s")
    return board


def random_seed(salt: int = 0) -> int:
    """A seed for a video that names none, from the clock (``salt`` tells apart the videos of one
    batch); a surface that draws one says it, so the video can be made again."""
    return int(time.time() * 1000 + salt) % (2**31 - 1)


RECORD_FORMAT = 2
"""Version of :func:`render_record`'s layout (a render folder from another layout is refused)."""


def render_record(request: GenerationRequest, **settings: Any) -> dict[str, Any]:
    """What a resumable render folder (``OUT.parts/request.json``) records, as JSON values: the
    request (its seed set) and the ``settings`` outside it that shape the file (the pipeline
    loaded, the output's upscaling). ``--resume`` continues a render only under an equal record."""
    return json.loads(json.dumps({"format": RECORD_FORMAT, **request.to_dict(), **settings}))


__all__ = [
    "RECORD_FORMAT",
    "GenerationRequest",
    "Storyboard",
    "prompt_changes",
    "random_seed",
    "render_record",
]
