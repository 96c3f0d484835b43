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


def test_no_anchor_yet_means_no_distance():
    anchor = StatsAnchor(chunks=2, strength=0.5, tolerance=0.1)
    drifted = _chunk(3.0, 2.0, 0)
    assert anchor.distance(drifted) == 0.0
    monitor = DriftMonitor()
    assert monitor.measure(drifted, anchor, False).stats_distance == 0.0
    assert monitor.measure(drifted, None, False).stats_distance == 0.0


def test_the_anchor_averages_every_opening_chunk_equally():
    anchor = StatsAnchor(chunks=3, strength=1.0, tolerance=0.1)
    for mean, std, seed in ((1.0, 1.0, 0), (4.0, 2.0, 1), (7.0, 6.0, 2)):
        anchor.apply(_chunk(mean, std, seed))
    torch.testing.assert_close(anchor.mean, torch.full((1, 3), 4.0))
    torch.testing.assert_close(anchor.std, torch.full((1, 3), 3.0))


def test_distance_is_the_largest_channel_deviation_in_anchor_stds():
    anchor = StatsAnchor(chunks=1, strength=0.5, tolerance=10.0)
    anchor.apply(_chunk(1.0, 2.0, 0))
    assert anchor.distance(_chunk(4.0, 2.0, 1)) == pytest.approx(1.5, abs=1e-5)  # mean 3 off
    assert anchor.distance(_chunk(1.0, 7.0, 2)) == pytest.approx(2.5, abs=1e-5)  # std 5 off
    assert anchor.distance(_chunk(-2.0, 3.0, 3)) == pytest.approx(1.5, abs=1e-5)  # mean -3, std +1
    # one channel off is enough: the largest channel counts
    chunk = _chunk(1.0, 2.0, 4)
    chunk[:, 1] += 5.0
    assert anchor.distance(chunk) == pytest.approx(2.5, abs=1e-5)
    # a flat anchor (std 0) measures in units of 1e-3, not of zero
    flat = StatsAnchor(chunks=1, strength=0.5, tolerance=10.0)
    flat.apply(torch.full((1, 3, 2, 6, 6), 0.5))
    assert flat.distance(torch.full((1, 3, 2, 6, 6), 0.51)) == pytest.approx(10.0, rel=1e-3)


def test_a_chunk_exactly_at_the_tolerance_is_left_alone():
    probe = StatsAnchor(chunks=1, strength=0.5, tolerance=0.0)
    probe.apply(_chunk(0.0, 1.0, 0))
    chunk = _chunk(0.7, 1.0, 1)
    at = probe.distance(chunk)
    anchor = StatsAnchor(chunks=1, strength=0.5, tolerance=at)
    anchor.apply(_chunk(0.0, 1.0, 0))
    assert anchor.apply(chunk) == (chunk, False)


def test_a_drifted_chunk_with_a_small_spread_is_widened_back():
    anchor = StatsAnchor(chunks=1, strength=0.5, tolerance=0.5)
    anchor.apply(_chunk(0.0, 1.0, 0))
    out, corrected = anchor.apply(_chunk(2.0, 0.25, 1))
    assert corrected
    mean, std = channel_stats(out)
    torch.testing.assert_close(mean, torch.full((1, 3), 1.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(std, torch.full((1, 3), 0.625), atol=1e-5, rtol=0)


def test_monitor_defaults_freeze_after_four_chunks_below_0_002():
    def ramp(step: float) -> torch.Tensor:
        """Two frames ``step`` apart: every chunk of a stream of them has change energy ``step``."""
        return torch.tensor([0.0, step]).view(1, 1, 2, 1, 1)

    slow, fast = DriftMonitor(), DriftMonitor()
    assert [slow.measure(ramp(0.0019), None, False).frozen for _ in range(5)] == [False] * 3 + [True] * 2
    assert not any(fast.measure(ramp(0.0021), None, False).frozen for _ in range(5))


def test_monitor_freeze_count_restarts_after_motion_and_a_chunk_at_the_threshold_moves():
    still = torch.full((1, 2, 2, 3, 3), 0.7)
    moving = torch.randn(1, 2, 2, 3, 3, generator=torch.Generator().manual_seed(0))
    monitor = DriftMonitor(freeze_threshold=1e-3, freeze_chunks=3)
    stream = (still, still, still, moving, still, still, still, still)
    # the first still chunk after motion still moves (from the moving chunk's last frame)
    assert [monitor.measure(x, None, False).frozen for x in stream] == [False, False, True] + [False] * 4 + [
        True
    ]
    # energy exactly at the threshold is motion
    at = DriftMonitor(freeze_threshold=0.5, freeze_chunks=1)
    step = torch.tensor([0.0, 0.5, 1.0]).view(1, 1, 3, 1, 1)
    measures = at.measure(step, None, False)
    assert measures.change_energy == 0.5 and not measures.frozen


def test_monitor_energy_of_single_frame_chunks_and_of_the_first_chunk():
    monitor = DriftMonitor()
    a = torch.zeros(1, 2, 1, 3, 3)
    assert monitor.measure(a, None, False).change_energy == 0.0  # nothing to compare with yet
    assert monitor.measure(a + 0.3, None, False).change_energy == pytest.approx(0.3)
    # a first chunk of two frames measures its own change
    assert DriftMonitor().measure(
        torch.tensor([0.0, 0.4]).view(1, 1, 2, 1, 1), None, False
    ).change_energy == (pytest.approx(0.4))
    # the next chunk starts from the previous chunk's *last* frame
    three = DriftMonitor()
    three.measure(torch.tensor([0.0, 0.0, 5.0]).view(1, 1, 3, 1, 1), None, False)
    assert three.measure(torch.full((1, 1, 3, 1, 1), 5.0), None, False).change_energy == 0.0


def test_monitor_repetition_is_the_cosine_similarity_to_an_earlier_chunk():
    """For each video of a batch, and the least similar video counts; small latents too."""
    g = torch.Generator().manual_seed(3)
    a, b, noise = (torch.randn(2, 2, 2, 3, 3, generator=g) * 0.01 for _ in range(3))
    c = 0.6 * a + 0.8 * noise  # partly a repeat of a
    expected = torch.nn.functional.cosine_similarity(c.flatten(1), a.flatten(1), dim=1).min().item()
    monitor = DriftMonitor()
    for x in (a, b):
        monitor.measure(x, None, False)
    # a is two chunks back: not the adjacent one, so it is compared
    assert monitor.measure(c, None, False).repetition == pytest.approx(expected, abs=1e-5)
    assert 0.3 < expected < 0.95


def test_monitor_history_holds_sixteen_chunks_by_default():
    g = torch.Generator().manual_seed(4)
    a = torch.randn(1, 2, 2, 3, 3, generator=g)
    others = [torch.randn(1, 2, 2, 3, 3, generator=g) for _ in range(16)]
    near, far = DriftMonitor(), DriftMonitor()
    for x in [a, *others[:15]]:
        near.measure(x, None, False)
    for x in [a, *others]:
        far.measure(x, None, False)
    assert near.measure(a, None, False).repetition == pytest.approx(1.0, abs=1e-5)  # 16 chunks back
    assert far.measure(a, None, False).repetition < 0.9  # 17 back: forgotten


def test_monitor_state_round_trips_and_reset_forgets():
    g = torch.Generator().manual_seed(5)
    chunks = [torch.randn(1, 2, 2, 3, 3, generator=g) for _ in range(4)]
    other = torch.randn(1, 2, 2, 3, 3, generator=g)
    still = torch.zeros(1, 2, 2, 3, 3)
    monitor = DriftMonitor(freeze_chunks=3)
    for x in (*chunks, still, still):
        monitor.measure(x, None, False)
    restored = DriftMonitor(freeze_chunks=3)
    restored.measure(other, None, False)  # what it held before is replaced, not added to
    restored.load_state(monitor.state())
    assert restored.quiet_chunks == 1
    for x in (chunks[0], still, other):  # chunks[0] moves from the saved last frame
        assert restored.measure(x, None, False) == monitor.measure(x, None, False)
    restored.reset()
    assert restored.quiet_chunks == 0
    fresh = DriftMonitor(freeze_chunks=3)
    for x in (chunks[0], chunks[2]):
        assert restored.measure(x, None, False) == fresh.measure(x, None, False)
    empty = DriftMonitor()
    empty.load_state(DriftMonitor().state())
    assert empty.measure(chunks[0], None, False) == DriftMonitor().measure(chunks[0], None, False)
