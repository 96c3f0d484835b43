"""``generation.timesteps``: a distilled model's fixed denoising timesteps (CausVid: 1000, 757, 522)
replace the shifted uniform schedule, in the plan and in the sampler alike."""

import pytest
import torch

from tests.tiny import FP32, tiny_components
from vidgen.config import ConfigError, load_config
from vidgen.pipelines import InputError

PROMPT = "a red circle moving left"


def _latents(pipe, **kwargs) -> torch.Tensor:
    return pipe(PROMPT, num_frames=9, generator=3, output_type="latent", **kwargs).frames


def test_explicit_timesteps_replace_the_shifted_schedule():
    uniform = tiny_components(**FP32, **{"generation.shift": 1.0})  # sigmas 1, .75, .5, .25
    listed = tiny_components(**FP32, **{"generation.timesteps": [1000, 750, 500, 250]})  # shift 3 unused
    assert listed.plan(PROMPT, num_frames=9).chunks[0].sigmas == [1.0, 0.75, 0.5, 0.25, 0.0]
    torch.testing.assert_close(_latents(listed), _latents(uniform), atol=0, rtol=0)
    causvid = tiny_components(
        **FP32, **{"generation.timesteps": [1000, 757, 522], "generation.num_inference_steps": 3}
    )
    assert causvid.plan(PROMPT, num_frames=9).chunks[0].sigmas == [1.0, 0.757, 0.522, 0.0]
    assert (_latents(causvid) - _latents(uniform)).abs().max() > 1e-3


def test_steps_must_match_the_timesteps():
    pipe = tiny_components(**FP32, **{"generation.timesteps": [1000, 750, 500, 250]})
    with pytest.raises(InputError, match="use 4 steps"):
        _latents(pipe, num_inference_steps=3)
    with pytest.raises(ConfigError, match="set num_inference_steps = 3"):
        load_config("default", **{"generation.timesteps": [1000, 757, 522]})
    with pytest.raises(ConfigError, match="must decrease"):
        load_config("default", **{"generation.timesteps": [1000, 522, 757, 100]})
