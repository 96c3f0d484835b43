"""Behaviour of drift correction (statistics anchor) and the drift monitor, in closed form."""

import pytest
import torch

from vidgen.pipelines.drift import DriftMonitor, StatsAnchor, channel_stats


def _chunk(mean: float, std: float, seed: int, shape=(1, 3, 2, 6, 6)) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    m, s = channel_stats(x)
    x = (x - m[:, :, None, None, None]) / s[:, :, None, None, None]  # exactly zero mean, unit std
    return x * std + mean


def test_anchor_is_the_running_mean_of_the_opening_chunks():
    anchor = StatsAnchor(chunks=2, strength=0.5, tolerance=0.1)
    first, second = _chunk(0.0, 1.0, 0), _chunk(1.0, 3.0, 1)
    for chunk in (first, second):
        out, corrected = anchor.apply(chunk)
        assert out is chunk and not corrected
    assert anchor.ready
    torch.testing.assert_close(anchor.mean, torch.full((1, 3), 0.5))
    torch.testing.assert_close(anchor.std, torch.full((1, 3), 2.0))


@pytest.mark.parametrize("strength", [0.25, 0.5, 1.0])
def test_a_drifted_chunk_is_pulled_back_toward_the_anchor_by_the_strength(strength):
    anchor = StatsAnchor(chunks=1, strength=strength, tolerance=0.5)
    anchor.apply(_chunk(0.0, 1.0, 0))
    drifted = _chunk(2.0, 3.0, 1)
    assert anchor.distance(drifted) == pytest.approx(2.0)  # max(|2 - 0| / 1, |3 - 1| / 1)
    out, corrected = anchor.apply(drifted)
    assert corrected
    mean, std = channel_stats(out)
    torch.testing.assert_close(mean, torch.full((1, 3), 2.0 + strength * (0.0 - 2.0)), atol=1e-5, rtol=0)
    torch.testing.assert_close(std, torch.full((1, 3), 3.0 + strength * (1.0 - 3.0)), atol=1e-5, rtol=0)
    assert anchor.distance(out) == pytest.approx((1 - strength) * 2.0, abs=1e-5)
    # the content is kept: the correction is an affine map per channel, not a replacement
    correlation = torch.corrcoef(torch.stack([out.flatten(), drifted.flatten()]))[0, 1]
    assert correlation.item() == pytest.approx(1.0, abs=1e-5)


def test_a_chunk_within_tolerance_or_with_zero_strength_is_left_alone():
    anchor = StatsAnchor(chunks=1, strength=0.5, tolerance=0.5)
    anchor.apply(_chunk(0.0, 1.0, 0))
    near = _chunk(0.3, 1.2, 1)
    out, corrected = anchor.apply(near)
    assert out is near and not corrected
    off = StatsAnchor(chunks=1, strength=0.0, tolerance=0.5)
    off.apply(_chunk(0.0, 1.0, 0))
    far = _chunk(5.0, 1.0, 2)
    out, corrected = off.apply(far)
    assert out is far and not corrected


def test_anchor_state_round_trips():
    anchor = StatsAnchor(chunks=1, strength=0.5, tolerance=0.1)
    anchor.apply(_chunk(1.0, 2.0, 0))
    restored = StatsAnchor(chunks=1, strength=0.5, tolerance=0.1)
    restored.load_state(anchor.state())
    drifted = _chunk(4.0, 2.0, 3)
    torch.testing.assert_close(restored.apply(drifted)[0], anchor.apply(drifted)[0])


def test_monitor_change_energy_counts_the_step_from_the_previous_chunk():
    monitor = DriftMonitor()
    a = torch.zeros(1, 2, 2, 3, 3)
    b = torch.ones(1, 2, 2, 3, 3)
    assert monitor.measure(a, None, False).change_energy == 0.0
    # frames: last of a (0), then b's two frames (1, 1): diffs 1 and 0 -> mean 0.5
    assert monitor.measure(b, None, False).change_energy == pytest.approx(0.5)


def test_monitor_flags_a_freeze_after_the_set_number_of_still_chunks():
    monitor = DriftMonitor(freeze_threshold=1e-3, freeze_chunks=3)
    still = torch.full((1, 2, 2, 3, 3), 0.7)
    frozen = [monitor.measure(still, None, False).frozen for _ in range(4)]
    assert frozen == [False, False, True, True]
    moving = torch.randn(1, 2, 2, 3, 3, generator=torch.Generator().manual_seed(0))
    assert not monitor.measure(moving, None, False).frozen


def test_monitor_repetition_sees_an_earlier_copy_but_not_the_adjacent_chunk():
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(1, 2, 2, 4, 4, generator=g) for _ in range(3))
    monitor = DriftMonitor()
    assert monitor.measure(a, None, False).repetition == 0.0
    assert monitor.measure(a.clone(), None, False).repetition == 0.0  # adjacent: meant to look alike
    monitor.measure(b, None, False)
    monitor.measure(c, None, False)
    assert monitor.measure(a.clone(), None, False).repetition == pytest.approx(1.0, abs=1e-5)
