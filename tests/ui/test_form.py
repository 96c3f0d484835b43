"""The page's form: storyboard parsing and every check that turns a bad field into a message."""

import dataclasses

import pytest

from vidgen.shapes.prompts import parse_prompt
from vidgen.ui.app import EXAMPLES
from vidgen.ui.form import AUTO_BACKEND, Form, FormError, build_request, parse_storyboard

PROMPT = "a red circle moving left on a black background"


@pytest.fixture(scope="module")
def info(tiny_sessions):
    return tiny_sessions.info


def test_storyboard_rows_in_every_shape_gradio_sends():
    rows = [[0, "a red circle"], ["2.5", " a blue square "], ["3 s", "a green triangle"], ["1:05", "x"]]
    expected = [(0.0, "a red circle"), (2.5, "a blue square"), (3.0, "a green triangle"), (65.0, "x")]
    assert parse_storyboard(rows) == expected
    assert parse_storyboard({"headers": ["start (s)", "prompt"], "data": rows}) == expected
    pd = pytest.importorskip("pandas")
    assert parse_storyboard(pd.DataFrame(rows, columns=["start (s)", "prompt"])) == expected
    # blank rows (a new table, a row left empty) are skipped
    assert parse_storyboard([[None, ""], ["", "  "], [float("nan"), None]]) == []
    assert parse_storyboard(None) == []


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([[1, "a"], [0.5, "b"]], "row 2 starts at 0.5 s, not after row 1"),
        ([[1, "a"], [1, "b"]], "row 2 starts at 1 s, not after row 1"),
        ([["soon", "a"]], "row 1: start 'soon' is not a time"),
        ([[1, ""]], "row 1 has no prompt"),
        ([[None, "a"]], "row 1 has no start time"),
        ([[-1, "a"]], "times start at 0"),
        ([[float("inf"), "a"]], "is not a time"),
        ("not a table", "table of rows"),
    ],
)
def test_bad_storyboards_name_the_row(rows, message):
    with pytest.raises(FormError, match=message):
        parse_storyboard(rows)


def test_the_prompt_opens_and_the_storyboard_follows(info):
    request, warnings = build_request(Form(prompt=PROMPT, seconds=4, seed=7), info)
    assert request.prompt == PROMPT and request.storyboard is None and request.seconds == 4
    assert request.seed == 7 and (request.height, request.width) == (64, 64) and warnings == []
    assert request.overrides == {}  # the form's defaults are the model's own

    rows = [[2, "a blue square moving up on a white background"]]
    request, _ = build_request(Form(prompt=PROMPT, storyboard=rows, seconds=4), info)
    assert request.prompt is None
    assert request.storyboard == [(0.0, PROMPT), (2.0, "a blue square moving up on a white background")]

    # no prompt: a storyboard from 0 s is the whole request
    request, _ = build_request(Form(prompt="", storyboard=[[0, "a"], [1, "b"]], seconds=4), info)
    assert request.storyboard == [(0.0, "a"), (1.0, "b")]
    request, _ = build_request(Form(prompt=" ", storyboard=[[0, "only"]], seconds=4), info)
    assert request.prompt == "only" and request.storyboard is None


def test_length_seed_and_late_rows(info):
    request, _ = build_request(Form(prompt=PROMPT, until_stopped=True, seconds=None), info)
    assert request.seconds is None
    request, _ = build_request(Form(prompt=PROMPT, seed=-1), info)
    other, _ = build_request(Form(prompt=PROMPT, seed=None), info)
    assert 0 <= request.seed < 2**31 and 0 <= other.seed < 2**31  # drawn, so it can be shown
    later = "a blue square moving up on a white background"
    _, warnings = build_request(Form(prompt=PROMPT, storyboard=[[5, later]], seconds=4), info)
    assert len(warnings) == 1 and "after the video ends" in warnings[0]


def test_words_and_sizes_the_model_was_not_made_for_warn(info):
    """The tiny model's config is the default model's: Shapes World words, trained at 64x64."""
    request, warnings = build_request(Form(prompt="a cat playing the piano, cinematic"), info)
    assert request.prompt == "a cat playing the piano, cinematic" and len(warnings) == 1
    assert "does not know 'cat', 'playing', 'piano', 'cinematic'" in warnings[0]
    assert "shapes (circle, square, triangle)" in warnings[0] and "backgrounds (black" in warnings[0]
    _, warnings = build_request(Form(prompt=PROMPT, height=128, width=128), info)
    assert warnings == [
        "the model was trained at 64x64 (WxH), not 128x128: expect fragments rather than a video; "
        "leave the size out (or set 64x64) for what it was made for"
    ]
    other = dataclasses.replace(
        info, config=info.config.replace(**{"model.vocabulary": "", "model.trained_sizes": ""})
    )
    assert build_request(Form(prompt="a cat playing the piano", height=128, width=128), other)[1] == []


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt": ""}, "the prompt is empty"),
        ({"prompt": "   \n"}, "the prompt is empty"),
        ({"prompt": "", "storyboard": [[2, "a"]]}, "starts at 2 s"),
        ({"storyboard": [[0, "a"]]}, "row 1 starts at 0 s, where the prompt starts"),
        ({"seconds": 0}, "seconds must be above 0"),
        ({"seconds": -3}, "seconds must be above 0"),
        ({"seconds": 1e9}, "at most 3600"),
        ({"seconds": "ten"}, "seconds must be a number"),
        ({"height": 60}, "height must be a positive multiple of 8"),
        ({"width": 0}, "width must be a positive multiple of 8"),
        ({"width": 4096}, "width must be at most 512"),
        ({"height": 64.5}, "height must be a whole number"),
        ({"steps": 0}, "steps must be at least 1"),
        ({"seed": -2}, "seed must be at least -1"),
        ({"seed": 1.5}, "seed must be a whole number"),
        ({"window_frames": 3}, "window_frames=3 must be a multiple of chunk_frames=2"),
        ({"window_frames": 0, "sink_frames": 0}, "sink_frames \\+ window_frames must be > 0"),
        ({"context_noise": 1.5}, "addnoise_condition is a noise level"),
        ({"attention_backend": "warp-drive"}, "attention backend 'warp-drive' cannot run here"),
    ],
)
def test_bad_fields_say_what_to_change(info, fields, message):
    form = Form(**{"prompt": PROMPT, "seconds": 4, **fields})
    with pytest.raises(FormError, match=message):
        build_request(form, info)


def test_advanced_options_become_overrides(info):
    form = Form(
        prompt=PROMPT,
        window_frames=8,
        sink_frames=0,
        anchor_stats=False,
        recache_every=4,
        context_noise=0.1,
        attention_backend="sdpa",
    )
    request, _ = build_request(form, info)
    assert request.overrides == {
        "generation.window_frames": 8,
        "generation.sink_frames": 0,
        "generation.addnoise_condition": 0.1,
        "drift.anchor_stats": False,
        "drift.recache_every": 4,
        "runtime.attention_backend": "sdpa",
    }
    request, _ = build_request(Form(prompt=PROMPT, attention_backend=AUTO_BACKEND), info)
    assert "runtime.attention_backend" not in request.overrides


def test_examples_speak_the_default_models_language(info):
    """Every example prompt names a colour, shape and background of Shapes World, and the form
    accepts every example as it stands."""
    for prompt, rows, seconds, until_stopped in EXAMPLES:
        for text in [prompt] + [r[1] for r in rows]:
            parse_prompt(text)  # raises on words the default model never saw
        build_request(
            Form(prompt=prompt, storyboard=rows, seconds=seconds, until_stopped=until_stopped), info
        )


def test_an_uploaded_start_becomes_the_requests_image_or_video(info, tmp_path):
    import numpy as np
    from PIL import Image

    from vidgen.video import write_mp4

    image = tmp_path / "start.png"
    Image.fromarray(np.zeros((32, 48, 3), np.uint8)).save(image)
    request, warnings = build_request(Form(prompt=PROMPT, start_file=str(image)), info)
    assert (request.image, request.video) == (str(image), None)
    assert warnings == ["the uploaded image is 48x32: it is stretched to 64x64"]
    clip = tmp_path / "clip.mp4"
    write_mp4(clip, np.zeros((5, 64, 64, 3), np.uint8), fps=16)
    request, warnings = build_request(Form(prompt=PROMPT, start_file=str(clip)), info)
    assert (request.image, request.video, warnings) == (None, str(clip), [])
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    with pytest.raises(FormError, match="the uploaded file cannot be used: not a video file"):
        build_request(Form(prompt=PROMPT, start_file=str(notes)), info)


def test_a_servers_limits_are_form_errors(tiny_sessions):
    info = dataclasses.replace(tiny_sessions.info, max_side=128, max_steps=16, limited=True)
    for fields, message in [
        ({"height": 2048, "width": 2048}, "height must be at most 128 on this server"),
        ({"steps": 17}, "steps must be at most 16 on this server"),
    ]:
        with pytest.raises(FormError, match=message):
            build_request(Form(prompt=PROMPT, **fields), info)
    request, _ = build_request(Form(prompt=PROMPT, height=128, width=128, steps=16), info)
    assert (request.height, request.num_inference_steps) == (128, 16)
