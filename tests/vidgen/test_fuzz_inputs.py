"""Generated inputs for every reader of what a user types or writes: ``vidgen render``'s arguments
and ``--set`` values, storyboards (JSON and TOML), jobs files and config files. Whatever they hold,
the answer is a value or one :class:`InputError` (exit 2): no other exception, no hang (each
example has a deadline)."""

from __future__ import annotations

import contextlib
import json
import math
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vidgen.config import load_config, parse_overrides
from vidgen.validation import InputError, parse_storyboard

SETTINGS = settings(
    max_examples=150,
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

special_floats = st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 0.0, -0.0, 1e-300])
numbers = st.one_of(
    st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True), special_floats
)
texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        numbers.filter(lambda x: not isinstance(x, float) or math.isfinite(x)),
        texts,
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=12,
)


@SETTINGS
@given(
    st.one_of(
        json_values.map(json.dumps),
        st.lists(st.tuples(numbers.map(str), texts), max_size=4).map(
            lambda rows: "[" + ",".join(f"[{s}, {json.dumps(p)}]" for s, p in rows) + "]"
        ),
        texts,
    )
)
def test_json_storyboards(text):
    try:
        board = parse_storyboard(text, "storyboard", toml=False)
    except InputError:
        return
    assert board and all(math.isfinite(start) and isinstance(prompt, str) for start, prompt in board)


@SETTINGS
@given(
    st.lists(st.tuples(st.one_of(numbers.map(str), texts.map(json.dumps)), texts), max_size=4).map(
        lambda scenes: "".join(f"[[scene]]\nstart = {s}\nprompt = {json.dumps(p)}\n" for s, p in scenes)
    )
    | texts
    | st.integers(1, 3000).map(lambda n: "a = " + "[" * n + "]" * n)
)
def test_toml_storyboards(text):
    with contextlib.suppress(InputError):
        parse_storyboard(text, "storyboard", toml=True)


KEYS = [
    "generation.window_frames", "generation.sink_frames", "generation.shift", "generation.fps",
    "generation.num_inference_steps", "generation.guidance_scale", "generation.chunk_frames",
    "generation.max_seconds", "generation.addnoise_condition", "generation.rope_mode", "drift.recache_every",
    "drift.anchor_strength", "runtime.threads", "runtime.attention_backend", "model.text_max_length",
    "model.loras", "model.vae", "generation.windw", "nonsense",
]  # fmt: skip
set_values = st.one_of(
    numbers.map(str), texts, st.sampled_from(["true", "[1, 2]", "nan", "inf", '"x"', "[[[[", "{}", "a:nan"])
)


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(KEYS), set_values), max_size=3))
def test_set_values_and_config_replace(items):
    config = load_config("default")
    try:
        overrides = parse_overrides([f"{k}={v}" for k, v in items])
        config.replace(**overrides)
    except InputError:
        pass


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["generation", "drift", "runtime", "model", "x"]),
            st.sampled_from(KEYS),
            set_values,
        ),
        max_size=4,
    )
)
def test_config_files(tmp_path_factory, tables):
    text = "".join(f"[{table}]\n{key.split('.')[-1]} = {value}\n" for table, key, value in tables)
    path = tmp_path_factory.mktemp("config") / "c.toml"
    path.write_text(text)
    with contextlib.suppress(InputError):
        load_config(path)


@SETTINGS
@given(
    st.lists(
        st.one_of(json_values.map(json.dumps), texts, st.just('{"prompt": "p", "out": "a.mp4"}')), max_size=5
    )
)
def test_jobs_files(tmp_path_factory, lines):
    from vidgen.distributed.batch import JobDefaults, read_jobs

    path = tmp_path_factory.mktemp("jobs") / "jobs.jsonl"
    path.write_text("\n".join(lines))
    with contextlib.suppress(InputError):
        read_jobs(path, JobDefaults())


class _Reached(Exception):
    """The command line passed every check made before the model loads."""


FLAGS = ["--seconds", "--fps", "--steps", "--height", "--width", "--seed", "--guidance", "--upscale",
         "--set", "--out", "--storyboard", "--image", "--lora", "--negative-prompt", "--sp", "--replicas"]  # fmt: skip


def _render(monkeypatch, folder, argv) -> str | int:
    """``main(argv)`` stopped where ``vidgen render`` loads the model: "reached", or the exit code."""
    from vidgen.cli import main, render

    def reached(*args, **kwargs):
        raise _Reached

    monkeypatch.chdir(folder)
    monkeypatch.setattr(render, "load_pipeline", reached)
    if "--out" not in argv:
        argv = [*argv, "--out", str(folder / "v.mp4")]
    try:
        return main(argv)
    except _Reached:
        return "reached"
    except SystemExit as exit:  # argparse's own refusals
        return int(exit.code or 0)


def test_a_good_command_line_reaches_the_loading(monkeypatch, tmp_path):
    assert (
        _render(monkeypatch, tmp_path, ["render", "a red circle", "--seconds", "3", "--seed", "1"])
        == "reached"
    )
    assert _render(monkeypatch, tmp_path, ["render", "a red circle", "--seconds", "nan"]) == 2


@SETTINGS
@given(
    st.lists(st.tuples(st.sampled_from(FLAGS), st.one_of(numbers.map(str), texts, set_values)), max_size=4),
    st.one_of(texts, st.just("a red circle")),
)
def test_render_command_lines(monkeypatch, tmp_path_factory, flags, prompt):
    """Every check ``vidgen render`` makes before loading a model: each generated command line ends
    in exit 2 with one line, or reaches the loading (stopped there, so nothing renders)."""
    argv = ["render", prompt, "--quiet"]
    for flag, value in flags:
        argv += [flag, value]
    assert _render(monkeypatch, tmp_path_factory.mktemp("render"), argv) in ("reached", 2)
