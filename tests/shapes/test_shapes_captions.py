"""Captions and prompts: the canonical template, paraphrases that parse back, held-out phrasings,
errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vidgen.shapes.captions import (
    HELD_OUT_TEMPLATES,
    TRAINING_TEMPLATES,
    canonical_caption,
    caption,
    storyboard_captions,
    storyboard_from_text,
)
from vidgen.shapes.prompts import (
    SHAPE_WORDS,
    SIZE_WORDS,
    SPEED_ADJECTIVES,
    SPEED_ADVERBS,
    PromptSpec,
    direction_phrases,
    parse_prompt,
)
from vidgen.shapes.world import ATTRIBUTES, DIRECTIONS, Scene, choices, sample_scene, sample_storyboard

ALL_SCENES = [
    Scene(**dict(zip(ATTRIBUTES, values, strict=True)))
    for values in itertools.product(*map(choices, ATTRIBUTES))
]
HELD_OUT_MARKERS = ("there is", "watch", "video of", "the background is", "we see", "keeps")


def _omissions(scene: Scene, rng: np.random.Generator) -> tuple[str, ...]:
    options = ["size", "direction"] + (["speed"] if scene.speed == "slow" else [])
    return tuple(a for a in options if rng.random() < 0.4)


def test_canonical_captions_are_the_spec_examples():
    red = Scene("black", "red", "circle", "medium", "slow", "left")
    assert canonical_caption(red, omit=("size", "speed")) == "a red circle moving left on a black background"
    blue = Scene("white", "blue", "square", "small", "fast", "up-right")
    assert caption(blue) == "a small fast blue square moving up-right on a white background"
    assert parse_prompt(caption(blue)) == PromptSpec.from_scene(blue)


def test_every_paraphrase_of_every_scene_parses_back():
    rng = np.random.default_rng(0)
    for scene in ALL_SCENES:
        for held_out in (False, True):
            omit = _omissions(scene, rng)
            text = caption(scene, rng, paraphrase=True, omit=omit, held_out=held_out)
            assert parse_prompt(text) == PromptSpec.from_scene(scene, omit), text


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), held_out=st.booleans())
def test_random_paraphrases_name_nothing_the_scene_does_not_show(seed, held_out):
    rng = np.random.default_rng(seed)
    scene = sample_scene(rng)
    text = caption(scene, rng, paraphrase=True, held_out=held_out)  # random omissions
    spec = parse_prompt(text)
    for attribute in ATTRIBUTES:
        assert getattr(spec, attribute) in (None, getattr(scene, attribute)), text
    assert (spec.color, spec.shape, spec.background) == (scene.color, scene.shape, scene.background)
    assert spec.named_speed == scene.speed  # an omitted speed means slow, and only slow is omitted


def test_every_word_of_the_vocabulary_parses():
    base = "a red {} moving left on a black background"
    for shape, words in SHAPE_WORDS.items():
        for word in words:
            assert parse_prompt(base.format(word)).shape == shape
    for size, words in SIZE_WORDS.items():
        for word in words:
            assert parse_prompt(f"a {word} red ball on a gray backdrop").size == size
    for speed, words in SPEED_ADJECTIVES.items():
        for word in words:
            assert parse_prompt(f"a {word} red ball on a gray backdrop").speed == speed
    for speed, words in SPEED_ADVERBS.items():
        for word in words:
            assert parse_prompt(f"a red ball going up {word} on white").speed == speed
    for direction in DIRECTIONS:
        for phrase in direction_phrases(direction):
            assert parse_prompt(f"a red box heading {phrase} over a beige backdrop").direction == direction
    assert parse_prompt("a pink dot drifting north-east on grey").direction == "up-right"
    assert parse_prompt("A PINK DOT DRIFTING SOUTHWEST ON A GREY BACKGROUND").direction == "down-left"


def test_people_style_prompts():
    assert parse_prompt("A red ball bouncing on a black background") == PromptSpec("red", "circle", "black")
    spec = parse_prompt("On a beige background, a big yellow wedge moves quickly down and to the right.")
    assert spec == PromptSpec("yellow", "triangle", "beige", "large", "fast", "down-right")
    spec = parse_prompt("the background is white and a tiny cyan block slides diagonally up-left")
    assert spec == PromptSpec("cyan", "square", "white", "small", None, "up-left")


def test_paraphrases_are_varied():
    rng = np.random.default_rng(1)
    scene = Scene("gray", "green", "triangle", "large", "fast", "down-left")
    texts = {caption(scene, rng, paraphrase=True) for _ in range(300)}
    assert len(texts) > 250
    assert any(t.isupper() for t in texts) and any(t.islower() for t in texts)
    assert any("backdrop" in t.lower() for t in texts) and any(t.lower().startswith("on ") for t in texts)


def test_held_out_phrasings_never_appear_in_training():
    assert not set(TRAINING_TEMPLATES) & set(HELD_OUT_TEMPLATES)
    rng = np.random.default_rng(2)
    training, held_out = set(), set()
    for scene in ALL_SCENES[::7]:
        training |= {caption(scene, rng, paraphrase=True).lower().rstrip(".") for _ in range(4)}
        held_out |= {caption(scene, rng, held_out=True).lower().rstrip(".") for _ in range(4)}
    assert not training & held_out
    assert all(any(m in t for m in HELD_OUT_MARKERS) for t in held_out)
    assert not any(m in t for t in training for m in HELD_OUT_MARKERS)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a ball moving left on a black background", "no object colour"),
        ("a red thing moving left on a black background", "no shape"),
        ("a red ball and a blue box on a black background", "several shapes"),
        ("a red ball moving left", "no background"),
        ("a red ball on a green background", "not a background colour"),
        ("a white ball on a black background", "not an object colour"),
        ("a red ball moving left and right on a black background", "opposite directions"),
        ("a small big red ball on a black background", "several sizes"),
        ("", "empty"),
    ],
)
def test_unreadable_prompts_raise_a_clear_error(text, message):
    with pytest.raises(ValueError, match=message):
        parse_prompt(text)


def test_a_fast_scene_cannot_hide_its_speed():
    scene = Scene("black", "red", "circle", "small", "fast", "left")
    with pytest.raises(ValueError, match="means slow"):
        caption(scene, omit=("speed",))
    rng = np.random.default_rng(3)
    assert all(parse_prompt(caption(scene, rng, paraphrase=True)).speed == "fast" for _ in range(100))


def test_storyboard_captions_and_text():
    rng = np.random.default_rng(4)
    board = sample_storyboard(rng, 8, 2)
    captions = storyboard_captions(board, rng, paraphrase=True)
    assert [t for t, _ in captions] == [t for t, _ in board]
    for (_, text), (_, scene) in zip(captions, board, strict=True):
        assert parse_prompt(text).color == scene.color
    text = "# a storyboard\n0: a red ball moving left on black\n\n2.5 s - a blue ball moving left on black\nat 4s: a blue box"
    assert storyboard_from_text(text) == [
        (0.0, "a red ball moving left on black"),
        (2.5, "a blue ball moving left on black"),
        (4.0, "a blue box"),
    ]
    with pytest.raises(ValueError, match="line 1"):
        storyboard_from_text("a red ball")
