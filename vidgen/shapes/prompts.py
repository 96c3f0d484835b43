"""What a Shapes World prompt names: ``PromptSpec``, the words for each attribute, and
``parse_prompt`` which reads them back from free text.

The vocabulary here is shared with ``vidgen.shapes.captions``, which writes captions from it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from vidgen.shapes.world import (
    BACKGROUNDS,
    COLORS,
    DEFAULT_SPEED,
    DIRECTIONS,
    SHAPES,
    SIZES,
    SPEEDS,
    Scene,
)

OMITTABLE: tuple[str, ...] = ("size", "speed", "direction")


@dataclass(frozen=True)
class PromptSpec:
    """The attributes a prompt names; ``None`` where it names none."""

    color: str
    """Object colour, a key of ``COLORS``."""
    shape: str
    """One of ``SHAPES``."""
    background: str
    """A key of ``BACKGROUNDS``."""
    size: str | None = None
    """A key of ``SIZES``; ``None``: any size."""
    speed: str | None = None
    """A key of ``SPEEDS``; ``None`` means slow (the spec's default)."""
    direction: str | None = None
    """A key of ``DIRECTIONS``; ``None``: any direction."""

    def __post_init__(self) -> None:
        tables = {
            "color": COLORS,
            "shape": SHAPES,
            "background": BACKGROUNDS,
            "size": SIZES,
            "speed": SPEEDS,
            "direction": DIRECTIONS,
        }
        for name, table in tables.items():
            value = getattr(self, name)
            if (value is not None or name in ("color", "shape", "background")) and value not in table:
                raise ValueError(f"PromptSpec.{name}={value!r}; choose one of {tuple(table)}")

    @classmethod
    def from_scene(cls, scene: Scene, omit: Iterable[str] = ()) -> PromptSpec:
        """The spec of a scene's caption that leaves out the attributes in ``omit``."""
        omit = _check_omit(scene, omit)
        return cls(
            color=scene.color,
            shape=scene.shape,
            background=scene.background,
            size=None if "size" in omit else scene.size,
            speed=None if "speed" in omit else scene.speed,
            direction=None if "direction" in omit else scene.direction,
        )

    @property
    def named_speed(self) -> str:
        """The speed the prompt asks for, the default when it names none."""
        return self.speed if self.speed is not None else DEFAULT_SPEED


def _check_omit(scene: Scene, omit: Iterable[str]) -> frozenset[str]:
    omit = frozenset(omit)
    if not omit <= set(OMITTABLE):
        raise ValueError(f"only {OMITTABLE} can be left out of a caption, got {sorted(omit)}")
    if "speed" in omit and scene.speed != DEFAULT_SPEED:
        raise ValueError(
            f"a caption that names no speed means {DEFAULT_SPEED}; the speed of a {scene.speed} scene "
            "cannot be left out"
        )
    return omit


# -- vocabulary shared by the generator and the parser -------------------------------------------------

SHAPE_WORDS: dict[str, tuple[str, ...]] = {
    "circle": ("circle", "ball", "disc", "disk", "dot", "orb"),
    "square": ("square", "box", "block", "tile"),
    "triangle": ("triangle", "wedge", "pyramid"),
}
SIZE_WORDS: dict[str, tuple[str, ...]] = {
    "small": ("small", "little", "tiny"),
    "medium": ("medium", "medium-sized", "mid-sized"),
    "large": ("large", "big", "huge"),
}
SPEED_ADJECTIVES: dict[str, tuple[str, ...]] = {
    "slow": ("slow", "slow-moving"),
    "fast": ("fast", "quick", "speedy", "fast-moving"),
}
SPEED_ADVERBS: dict[str, tuple[str, ...]] = {
    "slow": ("slowly", "at a slow pace", "lazily", "at low speed"),
    "fast": ("quickly", "fast", "rapidly", "swiftly", "at high speed"),
}
VERBS: tuple[tuple[str, str], ...] = (
    ("moving", "moves"),
    ("going", "goes"),
    ("sliding", "slides"),
    ("travelling", "travels"),
    ("traveling", "travels"),
    ("heading", "heads"),
    ("drifting", "drifts"),
    ("gliding", "glides"),
    ("bouncing", "bounces"),
    ("floating", "floats"),
)
BACKGROUND_WORDS: dict[str, tuple[str, ...]] = {
    "black": ("black",),
    "white": ("white",),
    "gray": ("gray", "grey"),
    "beige": ("beige",),
}
_CARDINAL_PHRASES: dict[str, tuple[str, ...]] = {
    "left": ("left", "to the left", "leftward", "leftwards", "toward the left", "towards the left"),
    "right": ("right", "to the right", "rightward", "rightwards", "toward the right", "towards the right"),
    "up": ("up", "upward", "upwards", "toward the top", "to the top"),
    "down": ("down", "downward", "downwards", "toward the bottom", "to the bottom"),
}


def direction_phrases(direction: str) -> tuple[str, ...]:
    """Ways of saying a direction, e.g. ``up and to the right`` for ``up-right``."""
    if direction in _CARDINAL_PHRASES:
        return _CARDINAL_PHRASES[direction]
    vertical, horizontal = direction.split("-")
    edge = {"up": "top", "down": "bottom"}[vertical]
    side = {"up": "upper", "down": "lower"}[vertical]
    return (
        direction,
        f"{vertical} and to the {horizontal}",
        f"{vertical} and {horizontal}",
        f"toward the {edge} {horizontal}",
        f"towards the {side} {horizontal}",
        f"to the {edge}-{horizontal}",
        f"diagonally {direction}",
        f"diagonally {vertical} and {horizontal}",
    )


# -- parsing ------------------------------------------------------------------------------------------

_SHAPE_TOKENS = {w: shape for shape, words in SHAPE_WORDS.items() for w in words} | {"cube": "square"}
_SIZE_TOKENS = {
    "small": "small",
    "little": "small",
    "tiny": "small",
    "medium": "medium",
    "mid": "medium",
    "large": "large",
    "big": "large",
    "huge": "large",
}
_SPEED_TOKENS = {
    "slow": "slow",
    "slowly": "slow",
    "lazily": "slow",
    "leisurely": "slow",
    "fast": "fast",
    "quick": "fast",
    "quickly": "fast",
    "speedy": "fast",
    "speedily": "fast",
    "rapid": "fast",
    "rapidly": "fast",
    "swift": "fast",
    "swiftly": "fast",
}
_SPEED_BIGRAMS = {("low", "speed"): "slow", ("high", "speed"): "fast", ("slow", "pace"): "slow"}
_COLOR_TOKENS = {c: c for c in COLORS} | {w: bg for bg, words in BACKGROUND_WORDS.items() for w in words}
_BACKGROUND_NOUNS = {"background", "backdrop", "canvas", "screen", "bg"}
# Direction words and their (x, y) sign; "up" is toward row 0, so its y sign is -1.
_DIRECTION_TOKENS = {
    "left": (-1, 0),
    "leftward": (-1, 0),
    "leftwards": (-1, 0),
    "west": (-1, 0),
    "right": (1, 0),
    "rightward": (1, 0),
    "rightwards": (1, 0),
    "east": (1, 0),
    "up": (0, -1),
    "upward": (0, -1),
    "upwards": (0, -1),
    "top": (0, -1),
    "upper": (0, -1),
    "north": (0, -1),
    "down": (0, 1),
    "downward": (0, 1),
    "downwards": (0, 1),
    "bottom": (0, 1),
    "lower": (0, 1),
    "south": (0, 1),
    "northeast": (1, -1),
    "northwest": (-1, -1),
    "southeast": (1, 1),
    "southwest": (-1, 1),
}
_DIRECTION_NAMES = {(int(np.sign(x)), int(np.sign(y))): name for name, (x, y) in DIRECTIONS.items()}


def parse_prompt(text: str) -> PromptSpec:
    """The attributes a free-text prompt names.

    Case-insensitive and robust to the paraphrases of ``caption`` (synonyms, word order,
    "over a gray backdrop", "up and to the right", "quickly", ...). Raises ``ValueError`` when
    the object colour, shape or background cannot be found, or when a prompt names two
    different values of one attribute.
    """
    tokens = re.findall(r"[a-z]+", text.lower())
    if not tokens:
        raise ValueError(f"empty prompt: {text!r}")

    shape_hits = [(i, _SHAPE_TOKENS[t]) for i, t in enumerate(tokens) if t in _SHAPE_TOKENS]
    shapes = {s for _, s in shape_hits}
    if len(shapes) != 1:
        found = "no shape" if not shapes else f"several shapes {sorted(shapes)}"
        raise ValueError(f"{found} in prompt {text!r}; name one of {SHAPES} (or ball, box, ...)")
    shape_at, shape = shape_hits[0]

    color_hits = [(i, _COLOR_TOKENS[t]) for i, t in enumerate(tokens) if t in _COLOR_TOKENS]
    background_at = _find_background(tokens, color_hits)
    if background_at is None:
        raise ValueError(
            f"no background colour in prompt {text!r}; say e.g. 'on a black background' "
            f"with one of {tuple(BACKGROUNDS)}"
        )
    background = _COLOR_TOKENS[tokens[background_at]]
    if background not in BACKGROUNDS:
        raise ValueError(
            f"{background!r} is not a background colour in {text!r}; use one of {tuple(BACKGROUNDS)}"
        )

    object_hits = [(i, c) for i, c in color_hits if i != background_at]
    if not object_hits:
        raise ValueError(f"no object colour in prompt {text!r}; name one of {tuple(COLORS)}")
    # Several colours left: the one closest before the shape word describes the object.
    before = [(i, c) for i, c in object_hits if i < shape_at]
    color = (before[-1] if before else object_hits[0])[1]
    if color not in COLORS:
        raise ValueError(f"{color!r} is not an object colour in {text!r}; use one of {tuple(COLORS)}")

    sizes = {_SIZE_TOKENS[t] for t in tokens if t in _SIZE_TOKENS}
    speeds = {_SPEED_TOKENS[t] for t in tokens if t in _SPEED_TOKENS}
    speeds |= {_SPEED_BIGRAMS[p] for p in zip(tokens, tokens[1:], strict=False) if p in _SPEED_BIGRAMS}
    return PromptSpec(
        color=color,
        shape=shape,
        background=background,
        size=_single("size", sizes, text),
        speed=_single("speed", speeds, text),
        direction=_parse_direction(tokens, text),
    )


def _find_background(tokens: list[str], color_hits: list[tuple[int, str]]) -> int | None:
    """Index of the token naming the background colour, or None."""
    for j, token in enumerate(tokens):
        if token not in _BACKGROUND_NOUNS:
            continue
        # "a black background", "a plain grey backdrop": a colour just before the noun.
        before = [i for i, _ in color_hits if j - 3 <= i < j]
        if before:
            return before[-1]
        # "the background is black", "background colour: white": a colour just after.
        after = [i for i, _ in color_hits if j < i <= j + 3]
        if after:
            return after[0]
    # No background noun: the one colour word that can only be a background ("on black").
    candidates = [i for i, c in color_hits if c in BACKGROUNDS]
    if len({c for i, c in color_hits if i in candidates}) == 1:
        return candidates[-1]
    return None


def _single(attribute: str, values: set[str], text: str) -> str | None:
    if len(values) > 1:
        raise ValueError(f"prompt {text!r} names several {attribute}s: {sorted(values)}")
    return next(iter(values), None)


def _parse_direction(tokens: list[str], text: str) -> str | None:
    xs = {_DIRECTION_TOKENS[t][0] for t in tokens if t in _DIRECTION_TOKENS} - {0}
    ys = {_DIRECTION_TOKENS[t][1] for t in tokens if t in _DIRECTION_TOKENS} - {0}
    if len(xs) > 1 or len(ys) > 1:
        raise ValueError(f"prompt {text!r} names opposite directions")
    if not xs and not ys:
        return None
    return _DIRECTION_NAMES[(next(iter(xs), 0), next(iter(ys), 0))]
