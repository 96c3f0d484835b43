"""Behaviour of the flow schedule and its two samplers, against closed forms.

With the oracle velocity of a one-point data distribution, ``v = (x - x0) / sigma``, every sampler
must land on ``x0``; what tells them apart is where each intermediate sample sits, which is what
these tests pin down.
"""

import pytest
import torch

from vidgen.pipelines.scheduler import FlowSchedule, SamplerKind, add_noise, shift_sigma, timestep_of


def _oracle(sample: torch.Tensor, clean: torch.Tensor, sigma: float) -> torch.Tensor:
    return (sample - clean) / sigma


def test_shifted_sigmas_follow_the_closed_form():
    schedule = FlowSchedule(num_steps=4, shift=3.0)
    expected = [3 * s / (1 + 2 * s) for s in (1.0, 0.75, 0.5, 0.25)] + [0.0]
    assert schedule.sigmas == pytest.approx(expected, abs=1e-12)
    assert shift_sigma(0.5, 3.0) == pytest.approx(0.75)
    assert FlowSchedule(num_steps=4, shift=1.0).sigmas == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    assert FlowSchedule(num_steps=3, timesteps=(1000.0, 757.0, 522.0)).sigmas == pytest.approx(
        [1.0, 0.757, 0.522, 0.0]
    )
    assert timestep_of(0.25) == 250.0


def test_euler_keeps_the_sample_on_the_straight_path():
    """x_sigma = (1 - sigma) x0 + sigma n at every level when the velocity is exact."""
    g = torch.Generator().manual_seed(0)
    clean, noise = torch.randn(2, 4, 3, 5, 5, generator=g), torch.randn(2, 4, 3, 5, 5, generator=g)
    schedule = FlowSchedule(num_steps=5, shift=2.0, sampler="euler")
    sample = noise.clone()
    for index, sigma in enumerate(schedule.sigmas[:-1]):
        sample = schedule.step(sample, _oracle(sample, clean, sigma), index)
        level = schedule.sigmas[index + 1]
        torch.testing.assert_close(sample, add_noise(clean, noise, level), atol=1e-5, rtol=0)


def test_euler_moves_by_the_level_difference_times_the_velocity():
    schedule = FlowSchedule(num_steps=4, shift=3.0)
    sample, velocity = torch.randn(1, 2, 2, 3, 3), torch.randn(1, 2, 2, 3, 3)
    sigmas = schedule.sigmas
    for index in range(4):
        moved = schedule.step(sample, velocity, index)
        torch.testing.assert_close(moved, sample + (sigmas[index + 1] - sigmas[index]) * velocity)


def test_x0_renoise_renoises_the_clean_estimate_to_the_next_level_with_fresh_noise():
    """Each step: predict x0, then (1 - sigma_next) x0 + sigma_next n' with n' drawn from the
    generator; the last step returns x0 itself."""
    g = torch.Generator().manual_seed(1)
    clean = torch.randn(1, 4, 2, 8, 8, generator=g)
    noise = torch.randn(1, 4, 2, 8, 8, generator=g)
    schedule = FlowSchedule(num_steps=3, sampler=SamplerKind.X0_RENOISE, timesteps=(1000.0, 757.0, 522.0))
    sample = noise.clone()
    generator = torch.Generator().manual_seed(7)
    for index, sigma in enumerate(schedule.sigmas[:-1]):
        expected_noise = torch.randn(clean.shape, generator=generator.clone_state())
        stepped = schedule.step(sample, _oracle(sample, clean, sigma), index, generator)
        sigma_next = schedule.sigmas[index + 1]
        if sigma_next == 0.0:
            torch.testing.assert_close(stepped, clean, atol=1e-5, rtol=0)
        else:
            torch.testing.assert_close(
                stepped, add_noise(clean, expected_noise, sigma_next), atol=1e-5, rtol=0
            )
            # fresh noise: not the noise the sample started from
            assert not torch.allclose(expected_noise, noise)
            # and of unit variance at that level
            recovered = (stepped - (1 - sigma_next) * clean) / sigma_next
            assert recovered.std().item() == pytest.approx(1.0, abs=0.1)
        sample = stepped


def test_x0_renoise_with_a_wrong_velocity_lands_on_its_own_clean_estimate():
    """The final step of x0_renoise is ``x - sigma * v`` (not an Euler step to 0 from that level)."""
    schedule = FlowSchedule(num_steps=2, shift=1.0, sampler="x0_renoise")
    sample, velocity = torch.randn(1, 2, 1, 2, 2), torch.randn(1, 2, 1, 2, 2)
    assert schedule.sigmas == [1.0, 0.5, 0.0]
    torch.testing.assert_close(schedule.step(sample, velocity, 1), sample - 0.5 * velocity)
    # euler's last step from 0.5 to 0 is the same formula; its first step is not a renoise
    euler = FlowSchedule(num_steps=2, shift=1.0, sampler="euler")
    torch.testing.assert_close(euler.step(sample, velocity, 0), sample - 0.5 * velocity)
    renoised = schedule.step(sample, velocity, 0, torch.Generator().manual_seed(123))
    assert not torch.allclose(renoised, sample - 0.5 * velocity)


def test_the_last_x0_renoise_step_draws_no_noise():
    """The generator feeds the next chunk's noise too: a step to level 0 must leave it untouched."""
    schedule = FlowSchedule(num_steps=2, shift=1.0, sampler="x0_renoise")
    sample, velocity = torch.randn(1, 2, 1, 2, 2), torch.randn(1, 2, 1, 2, 2)
    generator = torch.Generator().manual_seed(3)
    state = generator.get_state()
    schedule.step(sample, velocity, 1, generator)
    assert torch.equal(generator.get_state(), state)
    schedule.step(sample, velocity, 0, generator)
    assert not torch.equal(generator.get_state(), state)


def test_defaults_one_step_and_sampler_names():
    """Shift 3 and Euler unless told; a one-step schedule (a distilled model) goes 1 -> 0."""
    default = FlowSchedule(num_steps=4)
    assert default.sigmas == FlowSchedule(num_steps=4, shift=3.0).sigmas
    assert default.sampler is SamplerKind.EULER
    assert FlowSchedule(num_steps=1).sigmas == [1.0, 0.0]
    assert FlowSchedule(num_steps=2, sampler="x0_renoise").sampler is SamplerKind.X0_RENOISE


def test_a_schedule_is_a_value():
    schedule = FlowSchedule(num_steps=4, shift=5.0)
    assert schedule == FlowSchedule(num_steps=4, shift=5.0)
    assert hash(schedule) == hash(FlowSchedule(num_steps=4, shift=5.0))
    with pytest.raises(AttributeError):
        schedule.num_steps = 8  # type: ignore[misc]


@pytest.mark.parametrize(
    "bad",
    [
        {"num_steps": 0},
        {"num_steps": 2, "shift": 0.0},
        {"num_steps": 2, "timesteps": (900.0,)},
        {"num_steps": 2, "sampler": "heun"},
    ],
)
def test_bad_schedules_are_refused(bad):
    with pytest.raises(ValueError):
        FlowSchedule(**bad)
