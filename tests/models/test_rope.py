"""3-D rotary embedding and the long-video position schemes, against float64 closed forms."""

import math

import pytest
import torch

from vidgen.models.rope import (
    RopePositionMode,
    WanRope,
    apply_rope,
    axis_dims,
    frame_positions,
    rope_shift,
    rotate_pairs_real,
)


def _reference_angles(head_dim: int, frames: list[int], height: int, width: int, theta: float = 10000.0):
    """(S, head_dim // 2) angles in float64, written out per token and channel pair: the first
    pairs turn with the frame position, then the row, then the column, each axis with Wan's
    frequencies ``theta ** (-2 j / axis_dim)``."""
    t_dim, h_dim, w_dim = axis_dims(head_dim)
    rows = []
    for f in frames:
        for r in range(height):
            for c in range(width):
                row = []
                for position, dim in ((f, t_dim), (r, h_dim), (c, w_dim)):
                    row += [position * theta ** (-2 * j / dim) for j in range(dim // 2)]
                rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize(("head_dim", "dims"), [(12, (4, 4, 4)), (16, (8, 4, 4)), (128, (44, 42, 42))])
def test_axis_split_is_wans(head_dim, dims):
    """Wan 2.1 (head_dim 128) rotates 44 channels by time and 42 each by row and column."""
    assert axis_dims(head_dim) == dims


def test_rotation_tables_match_the_closed_form_per_token():
    """Frame positions given out of order and repeated, a non-square grid: every token's angles."""
    head_dim, frames, height, width = 16, [3, 0, 7, 7], 2, 3
    rotation = WanRope(head_dim, max_seq_len=16)(torch.tensor(frames), height, width)
    assert rotation.shape == (1, len(frames) * height * width, 1, head_dim // 2, 2)
    cos, sin = rotation.unbind(-1)
    angles = _reference_angles(head_dim, frames, height, width)
    torch.testing.assert_close(cos[0, :, 0].double(), angles.cos(), atol=1e-6, rtol=0)
    torch.testing.assert_close(sin[0, :, 0].double(), angles.sin(), atol=1e-6, rtol=0)


def test_default_theta_and_length_are_wans():
    rope = WanRope(12)
    cos, sin = rope(torch.tensor([5]), 1, 1).unbind(-1)
    angles = _reference_angles(12, [5], 1, 1, theta=10000.0)
    torch.testing.assert_close(cos[0, :, 0].double(), angles.cos(), atol=1e-6, rtol=0)
    torch.testing.assert_close(sin[0, :, 0].double(), angles.sin(), atol=1e-6, rtol=0)
    # the tables reach position 1023 and no further
    assert rope(torch.tensor([1023]), 1, 1).shape[1] == 1
    with pytest.raises(IndexError):
        rope(torch.tensor([1024]), 1, 1)


@pytest.mark.parametrize(("height", "width", "ok"), [(8, 8, True), (9, 1, False), (1, 9, False)])
def test_a_grid_larger_than_the_tables_is_refused(height, width, ok):
    rope = WanRope(12, max_seq_len=8)
    if ok:
        assert rope(torch.tensor([0]), height, width).shape[1] == height * width
    else:
        with pytest.raises(ValueError, match="exceeds rope_max_seq_len=8"):
            rope(torch.tensor([0]), height, width)


def _rotation(angles: torch.Tensor) -> torch.Tensor:
    return torch.stack((angles.cos(), angles.sin()), dim=-1).float()


def _rotation_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` (B, S, H, D), its rotation and the float64 reference: pair (2i, 2i+1) as
    x_2i + i x_2i+1, multiplied by e^{i angle}."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 3, 8, generator=g)
    angles = torch.rand(1, 6, 1, 4, generator=g, dtype=torch.float64) * 2 * math.pi
    pairs = torch.complex(x[..., 0::2].double(), x[..., 1::2].double()) * torch.polar(
        torch.ones_like(angles), angles
    )
    return x, _rotation(angles), torch.stack((pairs.real, pairs.imag), dim=-1).flatten(-2)


def test_apply_rope_rotates_each_channel_pair_as_a_complex_number():
    x, rotation, expected = _rotation_case()
    out = apply_rope(x, rotation)
    assert out.shape == x.shape and out.dtype == x.dtype
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)
    # bf16 keys come back bf16, rotated in float32
    assert apply_rope(x.bfloat16(), rotation).dtype == torch.bfloat16
    # a key cut from a fused projection (a strided view) rotates as its contiguous copy
    fused = torch.cat([x, torch.zeros_like(x)], dim=-1)[..., :8]
    torch.testing.assert_close(apply_rope(fused, rotation), out, atol=0, rtol=0)


def test_the_real_valued_rotation_is_the_complex_one():
    x, rotation, expected = _rotation_case()
    out = rotate_pairs_real(x.unflatten(-1, (-1, 2)), rotation).flatten(-2)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)


def test_compiled_apply_rope_takes_the_real_valued_form_with_the_same_result():
    """Inductor generates no code for complex tensors: under torch.compile the rotation is written
    with real multiplies (no complex-operator warning), and the result is the eager one's."""
    import warnings

    x, rotation, expected = _rotation_case()
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*complex.*")
        out = torch.compile(apply_rope, fullgraph=True)(x, rotation)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)


def test_attention_scores_depend_only_on_the_frame_distance():
    """What the rolling scheme relies on: shifting query and key frames together changes nothing."""
    rope = WanRope(16, max_seq_len=64)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)

    def score(query_frame: int, key_frame: int) -> float:
        rq = rope(torch.tensor([query_frame]), 1, 1)
        rk = rope(torch.tensor([key_frame]), 1, 1)
        return float((apply_rope(q, rq) * apply_rope(k, rk)).sum())

    assert score(9, 4) == pytest.approx(score(30, 25), abs=1e-4)
    assert score(9, 4) != pytest.approx(score(9, 5), abs=1e-3)


@pytest.mark.parametrize(
    ("first_query_frame", "mode", "shift"),
    [
        (10, RopePositionMode.ROLLING, 4),  # 10 - window 4 - sinks 2
        (6, RopePositionMode.ROLLING, 0),  # the window has not slid yet
        (3, RopePositionMode.ROLLING, 0),  # still filling: never a negative shift
        (10, "absolute", 0),
        (500, RopePositionMode.ABSOLUTE, 0),
    ],
)
def test_rope_shift(first_query_frame, mode, shift):
    assert rope_shift(first_query_frame, mode, sink_frames=2, window_frames=4) == shift


def test_rolling_positions_put_the_window_after_the_sinks():
    """Sinks 0-1 stay; frames 10-13 of the window move to 2-5, the query 14-15 to 6-7."""
    frames = torch.tensor([0, 1, 10, 11, 12, 13, 14, 15])
    shift = rope_shift(14, RopePositionMode.ROLLING, sink_frames=2, window_frames=4)
    assert frame_positions(frames, shift, sink_frames=2).tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    # a shift of one: the frame right after the sinks moves onto the last sink's position
    assert frame_positions(torch.tensor([0, 1, 2, 3]), 1, sink_frames=2).tolist() == [0, 1, 1, 2]
    # no shift: positions are the frames themselves
    assert frame_positions(frames, 0, sink_frames=2).tolist() == frames.tolist()
