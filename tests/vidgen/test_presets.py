"""Presets of the published causal Wan 2.1 systems: their settings, the schedules they claim to
reproduce, and where their weights come from."""

import pytest

from vidgen.config import load_config
from vidgen.pipelines.pipeline import flow_schedule

# (chunk_frames, num_inference_steps, timesteps, shift, sink_frames, window_frames, mode, guidance)
PUBLISHED = {
    "self-forcing": (3, 4, [], 5.0, 0, 18, "chunkwise", 1.0),
    "self-forcing-framewise": (1, 4, [], 5.0, 0, 20, "chunkwise", 1.0),
    "causvid": (3, 3, [1000, 757, 522], 8.0, 0, 18, "chunkwise", 1.0),
    "longlive": (3, 4, [], 5.0, 3, 6, "chunkwise", 1.0),
    "rolling-forcing": (3, 5, [], 5.0, 3, 18, "rolling_forcing", 1.0),
}
# the published systems' semantics: keys at their frame index, the context pass against the cache
REFERENCE_SEMANTICS = ("absolute", "window", 0)
# the Hugging Face ids each preset loads by default (transformer, its key, its LoRA)
HUB_IDS = {
    "self-forcing": ("gdhe17/Self-Forcing/checkpoints/self_forcing_dmd.pt", "generator_ema", ""),
    "causvid": ("tianweiy/CausVid/autoregressive_checkpoint/model.pt", "generator", ""),
    "longlive": (
        "Efficient-Large-Model/LongLive-1.3B/models/longlive_base.pt",
        "generator",
        "Efficient-Large-Model/LongLive-1.3B/models/lora.pt",
    ),
    "rolling-forcing": ("TencentARC/RollingForcing/checkpoints/rolling_forcing_dmd.pt", "generator_ema", ""),
}


@pytest.mark.parametrize("name", sorted(HUB_IDS))
def test_preset_names_its_hub_ids(name):
    m = load_config(name).model
    assert m.path == "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
    assert (m.transformer, m.transformer_key, m.transformer_lora) == HUB_IDS[name]


def test_a_transformer_given_on_the_command_line_drops_the_presets_key_and_lora():
    from vidgen.config import render_overrides

    config = load_config("longlive").replace(**render_overrides(transformer="/local/longlive-fused"))
    assert (config.model.transformer, config.model.transformer_key, config.model.transformer_lora) == (
        "/local/longlive-fused",
        "",
        "",
    )


WEIGHTS = {
    "self-forcing": ("huggingface.co/gdhe17/Self-Forcing", "self_forcing_dmd.pt", "--key generator_ema"),
    "self-forcing-framewise": ("huggingface.co/gdhe17/Self-Forcing", "--key generator_ema"),
    "causvid": ("huggingface.co/tianweiy/CausVid", "autoregressive_checkpoint/model.pt", "--key generator"),
    "longlive": ("huggingface.co/Efficient-Large-Model/LongLive-1.3B", "longlive_base.pt", "--lora lora.pt"),
    "rolling-forcing": (
        "huggingface.co/TencentARC/RollingForcing",
        "rolling_forcing_dmd.pt",
        "generator_ema",
    ),
}
# the warped denoising_step_list of each system's config (warp_denoising_step: true)
WARPED = {
    "self-forcing": [1000, 750, 500, 250],
    "longlive": [1000, 750, 500, 250],
    "rolling-forcing": [1000, 800, 600, 400, 200],
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_has_the_published_settings(name):
    config = load_config(name)
    g = config.generation
    got = (g.chunk_frames, g.num_inference_steps, g.timesteps, g.shift, g.sink_frames, g.window_frames)
    assert (*got, g.mode, g.guidance_scale) == PUBLISHED[name]
    assert g.sampler == "x0_renoise" and g.addnoise_condition == 0.0
    assert (g.rope_mode, g.context_pass, g.transition_chunks) == REFERENCE_SEMANTICS
    assert (config.model.text_encoder, config.model.vae, g.height, g.width, g.fps) == (
        "umt5",
        "wan",
        480,
        832,
        16,
    )


@pytest.mark.parametrize("name", sorted(WEIGHTS))
def test_preset_names_its_weights_and_how_to_convert_them(name):
    from importlib import resources

    text = (resources.files("vidgen.configs") / f"{name}.toml").read_text()
    assert "vidgen convert" in text
    for fact in WEIGHTS[name]:
        assert fact in text, fact


@pytest.mark.parametrize("name", sorted(WARPED))
def test_warped_step_lists_are_the_shifted_uniform_schedule(name):
    """Self Forcing's warp: timestep t -> the shifted level of sigma = t / 1000 on a 1000-step grid
    (FlowMatchScheduler with sigma_min 0, extra_one_step); written out here independently."""
    g = load_config(name).generation
    shift = 5.0  # timestep_shift of every one of these configs
    warped = [shift * (t / 1000) / (1 + (shift - 1) * (t / 1000)) for t in WARPED[name]]
    assert flow_schedule(g, g.num_inference_steps).sigmas == pytest.approx([*warped, 0.0], abs=1e-12)


def test_causvid_runs_its_listed_timesteps():
    g = load_config("causvid").generation
    assert flow_schedule(g, 3).sigmas == pytest.approx([1.0, 0.757, 0.522, 0.0])
