"""Property tests of request validation: any value either passes or raises the one user-error type.

Nothing is rendered: the CLI's fast checks, the storyboard / config / jobs parsers and the
pipeline's request check are fed arbitrary values and must never raise anything else.
"""

import argparse
import contextlib
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vidgen.cli.render import check_request
from vidgen.config import ConfigError, VidgenConfig, load_config, parse_overrides
from vidgen.validation import (
    MAX_SEED,
    InputError,
    check_number,
    parse_json,
    parse_storyboard,
    read_storyboard,
)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
ANY_NUMBER = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.booleans(),
    st.text(max_size=5),
    st.none(),
)
JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text(max_size=8)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=30,
)


@FAST
@given(value=ANY_NUMBER, integer=st.booleans())
def test_check_number_passes_only_finite_numbers_in_range(value, integer):
    try:
        got = check_number("x", value, integer=integer, positive=True, maximum=1e6)
    except InputError as err:
        assert str(err).startswith("x must be")
        return
    assert not isinstance(value, bool) and isinstance(value, (int, float))
    assert math.isfinite(got) and 0 < got <= 1e6
    assert not integer or (isinstance(got, int) and got == value)


def _render_args(**numbers):
    defaults = dict(seconds=1.0, steps=None, height=None, width=None, fps=None, guidance=None, seed=None)
    return argparse.Namespace(**{**defaults, **numbers}, sp=1, replicas=1, upscale=1, prompt="p")


@FAST
@given(
    name=st.sampled_from(["seconds", "guidance", "steps", "height", "width", "fps", "seed"]),
    value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70)),
)
def test_render_flags_are_accepted_or_refused_as_one_user_error(name, value):
    """What argparse can hand over (a float for --seconds/--guidance, an int otherwise)."""
    if name not in ("seconds", "guidance"):
        value = int(value) if isinstance(value, int) or math.isfinite(value) else 0
    try:
        check_request(_render_args(**{name: value}))
    except InputError as err:
        assert f"--{name}" in str(err)
        return
    assert math.isfinite(value) and (value >= 0 if name == "seed" else value > 0)
    if name not in ("seconds", "guidance"):  # their bounds are the config's, checked by plan()
        assert value <= (MAX_SEED if name == "seed" else 2**31)


@FAST
@given(
    key=st.sampled_from(
        [
            "generation.shift",
            "generation.max_seconds",
            "drift.anchor_strength",
            "generation.fps",
            "runtime.max_memory_gb",
            "generation.timesteps",
        ]
    ),
    raw=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.text(max_size=12),
        st.sampled_from(["nan", "inf", "-inf", "[1, nan]", "+inf", "true", "1e400"]),
    ),
)
def test_set_overrides_build_a_config_or_raise_one_user_error(key, raw):
    try:
        overrides = parse_overrides([f"{key}={raw}"])
        config = VidgenConfig().replace(**overrides)
    except InputError:
        return
    for table in config.to_dict().values():
        for value in table.values():
            for number in value if isinstance(value, list) else [value]:
                assert not isinstance(number, float) or math.isfinite(number)


@FAST
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".json", ".toml"]))
def test_any_bytes_as_a_storyboard_or_config_file(tmp_path_factory, data, suffix):
    path = tmp_path_factory.mktemp("f") / f"file{suffix}"
    path.write_bytes(data)
    try:
        board = read_storyboard(str(path))
    except InputError:
        pass
    else:
        assert board and all(math.isfinite(start) for start, _ in board)
    with contextlib.suppress(ConfigError):  # any other exception fails the test
        load_config(path)


@FAST
@given(data=JSON_VALUE)
def test_any_json_storyboard_parses_to_finite_scenes_or_one_user_error(data):
    text = json.dumps(data)  # may hold NaN / Infinity: json.dumps writes them
    try:
        board = parse_storyboard(text, "board", toml=False)
    except InputError:
        return
    assert board and all(isinstance(s, float) and math.isfinite(s) and isinstance(p, str) for s, p in board)


@settings(max_examples=30, deadline=None)
@given(depth=st.integers(1, 5000), opener=st.sampled_from(["[", '{"a":']))
def test_deep_json_is_refused_before_the_parser_recurses(depth, opener):
    closer = "]" if opener == "[" else "}"
    text = opener * depth + "0" + closer * depth
    if depth > 16:
        with pytest.raises(InputError, match="nested deeper than 16"):
            parse_json(text, "board")
    else:
        parse_json(text, "board")


@pytest.fixture(scope="module")
def pipe():
    from tests.tiny import tiny_components

    return tiny_components()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seconds=st.one_of(st.none(), ANY_NUMBER),
    num_frames=st.one_of(st.none(), ANY_NUMBER),
    steps=st.one_of(st.none(), ANY_NUMBER),
    guidance=st.one_of(st.none(), ANY_NUMBER),
    board=st.one_of(st.none(), JSON_VALUE),
)
def test_the_pipeline_request_check_raises_only_input_error(
    pipe, seconds, num_frames, steps, guidance, board
):
    """The API's check of a request (no rendering): a result, or InputError, never another exception."""
    prompt = None if board is not None else "a red circle"
    try:
        _, frames = pipe._check_request(
            prompt, board, num_frames, seconds, 16, steps=steps, guidance=guidance
        )
    except InputError:
        return
    assert frames is None or (isinstance(frames, int) and 1 <= frames <= 3600 * 16)
