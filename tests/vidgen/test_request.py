"""``GenerationRequest``: one request for every surface, checked by one ``validate``, kept as JSON,
run by one mapping into ``LongVideoPipeline.stream``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from tests.tiny import tiny_components
from vidgen.cli import build_parser
from vidgen.cli.render import check_request, request_of
from vidgen.request import GenerationRequest, render_record
from vidgen.validation import InputError

PROMPT = "a red circle moving left on a black background"
BLUE = "a blue square moving up on a white background"


@pytest.fixture(scope="module")
def pipe():
    return tiny_components()


@pytest.fixture(scope="module")
def start_image(tmp_path_factory):
    path = tmp_path_factory.mktemp("start") / "start.png"
    Image.fromarray((np.random.default_rng(1).random((64, 64, 3)) * 255).astype(np.uint8)).save(path)
    return str(path)


def test_json_round_trip_keeps_every_field():
    request = GenerationRequest(
        storyboard=[(0.0, PROMPT), (1.5, BLUE)],
        seconds=2.5,
        height=32,
        width=48,
        num_inference_steps=3,
        guidance_scale=2.0,
        negative_prompt="blurry",
        seed=11,
        fps=8,
        overrides={"generation.window_frames": 8, "drift.anchor_stats": False},
        image="/data/start.png",
    )
    text = request.to_json()
    assert json.loads(text)["storyboard"] == [[0.0, PROMPT], [1.5, BLUE]]  # plain JSON
    again = GenerationRequest.from_json(text)
    assert again == request and again.storyboard == [(0.0, PROMPT), (1.5, BLUE)]
    video = GenerationRequest(prompt=PROMPT, video="clip.mp4")
    assert GenerationRequest.from_json(video.to_json()) == video
    with pytest.raises(InputError, match="unknown key 'colour'"):
        GenerationRequest.from_dict({**video.to_dict(), "colour": "red"})
    with pytest.raises(InputError, match="seconds must be a positive number, got -1"):
        GenerationRequest.from_dict({**video.to_dict(), "seconds": -1})


@pytest.mark.parametrize(
    "fields, message",
    [
        ({}, "pass exactly one of prompt= or storyboard="),
        ({"prompt": PROMPT, "storyboard": [(0, PROMPT)]}, "pass exactly one of prompt= or storyboard="),
        ({"prompt": "  "}, "the prompt is empty"),
        ({"prompt": "caf\udce9"}, "the prompt is not valid UTF-8 text"),
        ({"storyboard": [(1, PROMPT)]}, "a storyboard starts at 0 s"),
        ({"storyboard": [(0, PROMPT), (0, BLUE)]}, "storyboard times must increase"),
        ({"prompt": PROMPT, "seconds": 0}, "seconds must be a positive number, got 0"),
        ({"prompt": PROMPT, "seconds": float("inf")}, "seconds must be a finite number"),
        ({"prompt": PROMPT, "height": 64.5}, "height must be an integer, got 64.5"),
        ({"prompt": PROMPT, "num_inference_steps": 0}, "num_inference_steps must be a positive integer"),
        ({"prompt": PROMPT, "guidance_scale": 1e9}, "guidance_scale must be at most 100"),
        ({"prompt": PROMPT, "seed": -1}, "seed must be at least 0"),
        ({"prompt": PROMPT, "fps": True}, "fps must be an integer, got bool True"),
        ({"prompt": PROMPT, "negative_prompt": 3}, "negative_prompt must be a string"),
        ({"prompt": PROMPT, "overrides": {"window_frames": 8}}, "overrides must map 'table.key' names"),
        ({"prompt": PROMPT, "image": "a.png", "video": "b.mp4"}, "pass image or video, not both"),
    ],
)
def test_a_bad_field_is_one_input_error_naming_it(fields, message):
    with pytest.raises(InputError) as err:
        GenerationRequest(**fields).validate()
    assert message in str(err.value)


def test_the_cli_and_the_api_refuse_the_same_field_in_their_own_words(pipe):
    """One check, named as each surface names the argument."""
    with pytest.raises(InputError, match="^num_inference_steps must be a positive integer, got 0$"):
        GenerationRequest(prompt=PROMPT, num_inference_steps=0).validate()
    args = build_parser().parse_args(["render", "--prompt", PROMPT, "--steps", "0"])
    with pytest.raises(InputError, match="^--steps must be a positive integer, got 0$"):
        check_request(args)
    args = build_parser().parse_args(["render", "--prompt", PROMPT, "--image", "a.png", "--seed", "-3"])
    with pytest.raises(InputError, match="^--seed must be at least 0, got -3$"):
        check_request(args)
    # the session manager (the page's backend, each Serve replica) refuses it when it opens
    from vidgen.pipelines.session import SessionManager

    with pytest.raises(InputError, match="^seed must be at least 0, got -3$"):
        SessionManager(pipe).open(GenerationRequest(prompt=PROMPT, seed=-3))


def test_the_ray_render_refuses_a_bad_request_before_ray_starts(tmp_path):
    pytest.importorskip("ray")
    from vidgen.distributed.render import render_on_ray

    with pytest.raises(InputError, match="^seconds must be a positive number, got -1$"):
        render_on_ray(GenerationRequest(prompt=PROMPT, seconds=-1), tmp_path / "x.mp4", address="nowhere:1")
    assert not list(tmp_path.iterdir())


def test_stream_kwargs_make_the_video_the_arguments_name(pipe, start_image):
    """The one mapping: each field reaches its ``stream`` argument. Guidance on, so the negative
    prompt counts; a start image, so ``include_input`` counts (the video opens with its frame)."""
    request = GenerationRequest(
        prompt=PROMPT,
        seconds=0.5,
        guidance_scale=3.0,
        negative_prompt="a blue square",
        seed=5,
        image=start_image,
        overrides={"generation.window_frames": 2},
    )
    mapped = np.concatenate([c.frames for c in pipe.stream(**request.stream_kwargs())])
    named = pipe.stream(
        PROMPT,
        seconds=0.5,
        guidance_scale=3.0,
        negative_prompt="a blue square",
        generator=5,
        image=start_image,
        include_input=True,
        overrides={"generation.window_frames": 2},
    )
    assert np.array_equal(mapped, np.concatenate([c.frames for c in named]))
    assert len(mapped) == 1 + 8
    other_negative = GenerationRequest(**{**request.to_dict(), "negative_prompt": "a green triangle"})
    changed = np.concatenate([c.frames for c in pipe.stream(**other_negative.stream_kwargs())])
    assert not np.array_equal(mapped, changed)  # the negative prompt is not dropped on the way


def test_fps_is_a_config_change_of_the_video(pipe):
    request = GenerationRequest(prompt=PROMPT, seconds=1, fps=8, overrides={"drift.anchor_stats": False})
    assert request.config_overrides() == {"drift.anchor_stats": False, "generation.fps": 8}
    assert request.num_frames(8) == 8 and GenerationRequest(prompt=PROMPT).num_frames(8) is None
    frames = sum(len(c.frames) for c in pipe.stream(**request.stream_kwargs()))
    assert frames == 8


def test_a_render_record_is_json_and_names_the_format():
    request = GenerationRequest(storyboard=[(0.0, PROMPT), (1.0, BLUE)], seconds=2, seed=3)
    record = render_record(request, model=None, upscale=[1, "nearest"])
    assert record == json.loads(json.dumps(record))  # what a file gives back compares equal
    assert record["format"] == 2 and record["storyboard"] == [[0.0, PROMPT], [1.0, BLUE]]
    assert record["seed"] == 3 and record["upscale"] == [1, "nearest"]


def test_the_negative_prompt_reaches_the_request_from_the_cli_and_the_jobs_file(tmp_path):
    """``--negative-prompt`` and a jobs line's ``"negative_prompt"`` become the request's, the
    command line's being every job's default; an unreadable one is refused in the CLI's words."""
    from vidgen.distributed.batch import JobDefaults, read_jobs

    args = build_parser().parse_args(["render", PROMPT, "--guidance", "3", "--negative-prompt", "blurry"])
    args.prompt = args.text
    request = request_of(args)
    assert (request.negative_prompt, request.guidance_scale) == ("blurry", 3.0)
    assert request.stream_kwargs()["negative_prompt"] == "blurry"

    jobs = tmp_path / "jobs.jsonl"
    lines = [
        {"prompt": PROMPT, "out": str(tmp_path / "a.mp4")},
        {"prompt": PROMPT, "negative_prompt": "a square", "out": str(tmp_path / "b.mp4")},
    ]
    jobs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    a, b = read_jobs(jobs, JobDefaults(request=request))
    assert (a.request.negative_prompt, b.request.negative_prompt) == ("blurry", "a square")

    args = build_parser().parse_args(["render", "--prompt", PROMPT, "--negative-prompt", "bad\udcffbytes"])
    with pytest.raises(InputError, match="^--negative-prompt "):
        check_request(args)
