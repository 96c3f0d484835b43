"""The default model's vocabulary: every caption it was trained or evaluated on passes without a
warning; an off-topic prompt gets one naming its unknown words and what the model understands."""

import numpy as np

from vidgen.shapes import caption, sample_scene, sample_storyboard, storyboard_captions
from vidgen.shapes.vocabulary import prompt_warning, unknown_words


def test_every_training_and_held_out_caption_is_known():
    for seed in range(400):
        rng = np.random.default_rng(seed)
        scene = sample_scene(rng)
        for text in (
            caption(scene),
            caption(scene, rng, paraphrase=True),
            caption(scene, rng, held_out=True),
        ):
            assert prompt_warning(text) is None, text
        for _, text in storyboard_captions(sample_storyboard(rng, 8.0, 2), rng, paraphrase=True):
            assert prompt_warning(text) is None, text


def test_off_topic_prompt_names_its_unknown_words_and_the_vocabulary():
    assert unknown_words("A cat playing the piano, cinematic. A CAT!") == [
        "cat",
        "playing",
        "piano",
        "cinematic",
    ]
    warning = prompt_warning("a cat playing the piano, cinematic")
    assert "does not know 'cat', 'playing', 'piano', 'cinematic'" in warning
    for part in (
        "colours (red, green, blue, yellow, orange, purple, cyan, pink)",
        "shapes (circle, square, triangle)",
        "sizes (small, medium, large)",
        "speeds (slow, fast)",
        "directions (left, right, up, down, up-left",
        "backgrounds (black, white, gray, beige)",
    ):
        assert part in warning


def test_known_words_that_do_not_make_a_scene_say_what_is_missing():
    warning = prompt_warning("a red circle")
    assert warning is not None and "no background colour" in warning
    assert prompt_warning("a big red ball bouncing to the right on a grey backdrop") is None
