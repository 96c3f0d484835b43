"""Captions for Shapes World: the canonical template, training paraphrases and held-out
paraphrases, for single scenes and storyboards.

A caption may leave out the size, the speed (then it means slow) and the direction. The
paraphrase templates come in two disjoint sets: ``TRAINING_TEMPLATES`` for training data and
``HELD_OUT_TEMPLATES`` for evaluation prompts that never appear verbatim in training.
``parse_prompt`` (from ``vidgen.shapes.prompts``, re-exported here) reads any of them back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np

from vidgen.shapes.prompts import (
    BACKGROUND_WORDS,
    SHAPE_WORDS,
    SIZE_WORDS,
    SPEED_ADJECTIVES,
    SPEED_ADVERBS,
    VERBS,
    PromptSpec,
    direction_phrases,
    parse_prompt,
)
from vidgen.shapes.world import DEFAULT_SPEED, Scene, as_rng

__all__ = [
    "HELD_OUT_TEMPLATES",
    "TRAINING_TEMPLATES",
    "PromptSpec",
    "canonical_caption",
    "caption",
    "parse_prompt",
    "random_omissions",
    "storyboard_captions",
    "storyboard_from_text",
]

# -- templates ----------------------------------------------------------------------------------------
# Slots: {np} the object ("a small red ball"), {ing} "moving left quickly", {s} "moves left quickly",
# {on} "on a black background", {bgnp} "a black background", {bgcolor} "black".

TRAINING_TEMPLATES: tuple[str, ...] = (
    "{np} {ing} {on}",
    "{on}, {np} {s}",
    "{np} that {s} {on}",
    "{np}, {ing}, {on}",
    "{np} {s} {on}",
    "{np} {on}, {ing}",
    "{bgnp} with {np} {ing}",
    "{np} {on} {ing}",
)
HELD_OUT_TEMPLATES: tuple[str, ...] = (
    "there is {np} {ing} {on}",
    "watch {np} as it {s} {on}",
    "a video of {np} {ing} {on}",
    "the background is {bgcolor} and {np} {s}",
    "{on} we see {np} {ing}",
    "{np} keeps {ing} {on}",
)
_BACKGROUND_PHRASES: tuple[str, ...] = (
    "on a {c} background",
    "over a {c} backdrop",
    "against a {c} background",
    "on a {c} backdrop",
    "in front of a {c} background",
    "on a plain {c} background",
    "on a {c} canvas",
    "across a {c} screen",
    "on {c}",
)
_ARTICLES: tuple[str, ...] = ("a", "a", "a", "one", "the", "")


def canonical_caption(scene_or_spec: Scene | PromptSpec, omit: Iterable[str] = ()) -> str:
    """The spec's template: ``a {size} {speed} {color} {shape} moving {direction} on a {bg} background``.

    Attributes in ``omit`` (or ``None`` in a ``PromptSpec``) are left out; with no direction the
    object is just ``moving``.
    """
    spec = _as_spec(scene_or_spec, omit)
    words = ["a", spec.size, spec.speed, spec.color, spec.shape, "moving", spec.direction]
    return " ".join(w for w in words if w) + f" on a {spec.background} background"


def caption(
    scene_or_spec: Scene | PromptSpec,
    rng: np.random.Generator | int | None = None,
    *,
    paraphrase: bool = False,
    omit: Iterable[str] | None = None,
    held_out: bool = False,
) -> str:
    """A caption of a scene (or of the attributes a ``PromptSpec`` names).

    Args:
        scene_or_spec: what the caption describes; a ``PromptSpec``'s ``None`` attributes are left out.
        rng: Generator or seed for paraphrases and random omissions.
        paraphrase: a random paraphrase instead of the canonical template.
        omit: attributes of a ``Scene`` to leave out (from ``size``, ``speed``, ``direction``; the
            speed only of a slow scene). ``None``: none for the canonical caption; a random
            choice for paraphrases.
        held_out: draw from ``HELD_OUT_TEMPLATES`` (implies ``paraphrase``), which training
            captions never use.
    """
    if not (paraphrase or held_out):
        return canonical_caption(scene_or_spec, omit or ())
    rng = as_rng(rng)
    if omit is None and isinstance(scene_or_spec, Scene):
        omit = random_omissions(scene_or_spec, rng)
    spec = _as_spec(scene_or_spec, omit or ())
    template = str(rng.choice(HELD_OUT_TEMPLATES if held_out else TRAINING_TEMPLATES))
    return _casing(_fill(template, spec, rng), rng)


def _as_spec(scene_or_spec: Scene | PromptSpec, omit: Iterable[str]) -> PromptSpec:
    if isinstance(scene_or_spec, Scene):
        return PromptSpec.from_scene(scene_or_spec, omit)
    if omit:
        raise ValueError("omit applies to a Scene; a PromptSpec already leaves out what is None")
    return scene_or_spec


def random_omissions(
    scene: Scene, rng: np.random.Generator, direction: bool | None = None
) -> tuple[str, ...]:
    """Attributes to leave out at random; ``direction`` (when not None) says whether the
    direction is. Only a slow speed is left out: a caption without a speed means slow."""
    omit = []
    if rng.random() < 0.35:
        omit.append("size")
    if scene.speed == DEFAULT_SPEED and rng.random() < 0.5:
        omit.append("speed")
    if rng.random() < 0.1 if direction is None else direction:
        omit.append("direction")
    return tuple(omit)


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return options[int(rng.integers(len(options)))]


def _fill(template: str, spec: PromptSpec, rng: np.random.Generator) -> str:
    # Name the speed as an adjective, as an adverb, or not at all (when the prompt names none).
    adjective = adverb = ""
    if spec.speed is not None:
        if rng.random() < 0.5:
            adjective = _pick(rng, SPEED_ADJECTIVES[spec.speed])
        else:
            adverb = _pick(rng, SPEED_ADVERBS[spec.speed])
    size = _pick(rng, SIZE_WORDS[spec.size]) if spec.size is not None else ""
    noun = _pick(rng, SHAPE_WORDS[spec.shape])
    described = " ".join(w for w in (size, adjective, spec.color, noun) if w)
    article = _pick(rng, _ARTICLES)
    if article == "a" and described[0] in "aeiou":
        article = "an"
    np_phrase = f"{article} {described}".strip()

    ing, s = _pick(rng, VERBS)
    if spec.direction is not None:
        where = _pick(rng, direction_phrases(spec.direction))
    else:
        where = _pick(rng, ("", "around", "about"))
    motion = [w for w in (where, adverb) if w]
    if adverb and where and rng.random() < 0.5:
        motion.reverse()  # "moving quickly to the left" as well as "moving to the left quickly"
    tail = " ".join(motion)
    ing_phrase = f"{ing} {tail}".strip()
    s_phrase = f"{s} {tail}".strip()

    color = _pick(rng, BACKGROUND_WORDS[spec.background])
    on = _pick(rng, _BACKGROUND_PHRASES).format(c=color)
    bg_np = _pick(rng, ("a {c} background", "a {c} backdrop", "a plain {c} background")).format(c=color)
    return template.format(np=np_phrase, ing=ing_phrase, s=s_phrase, on=on, bgnp=bg_np, bgcolor=color)


def _casing(text: str, rng: np.random.Generator) -> str:
    style = rng.choice(["lower", "lower", "lower", "sentence", "title", "upper"])
    if style == "sentence":
        text = text[0].upper() + text[1:]
    elif style == "title":
        text = " ".join(w[:1].upper() + w[1:] for w in text.split(" "))
    elif style == "upper":
        text = text.upper()
    return text + "." if rng.random() < 0.3 else text


# -- storyboards --------------------------------------------------------------------------------------


def storyboard_captions(
    storyboard: Sequence[tuple[float, Scene]],
    rng: np.random.Generator | int | None = None,
    *,
    paraphrase: bool = False,
    held_out: bool = False,
) -> list[tuple[float, str]]:
    """Captions ``[(start_seconds, caption), ...]`` for a storyboard of scenes.

    Each caption describes its whole scene. Paraphrases leave out the size and the (slow)
    speed at random, and the direction either in every caption or in none: a caption that
    leaves it out does not say it changed, so a later caption naming the direction would
    read as a new direction while the object keeps the one it has (possibly bounced).
    """
    rng = as_rng(rng)
    if not (paraphrase or held_out):
        return [(t, caption(scene)) for t, scene in storyboard]
    no_direction = bool(rng.random() < 0.1)
    return [
        (
            t,
            caption(
                scene,
                rng,
                omit=random_omissions(scene, rng, no_direction),
                held_out=held_out,
                paraphrase=True,
            ),
        )
        for t, scene in storyboard
    ]


_STORYBOARD_LINE = re.compile(
    r"^\s*(?:at\s+)?(\d+(?:\.\d*)?)\s*(?:s|sec|secs|seconds?)?\s*[:\-\u2013|]\s*(.+?)\s*$", re.IGNORECASE
)


def storyboard_from_text(text: str) -> list[tuple[float, str]]:
    """Read a storyboard written one change per line, e.g. ``0: a red ball ...`` / ``5 s - ...``.

    Blank lines and lines starting with ``#`` are skipped.
    """
    storyboard = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _STORYBOARD_LINE.match(line)
        if match is None:
            raise ValueError(f"line {number} is not '<seconds>: <caption>': {line!r}")
        storyboard.append((float(match.group(1)), match.group(2)))
    if not storyboard:
        raise ValueError("the storyboard text has no '<seconds>: <caption>' lines")
    return storyboard
