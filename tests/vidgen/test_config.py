"""Typed configs: presets load, unknown keys are named, values are validated with a useful message."""

import pytest

from vidgen.config import ConfigError, VidgenConfig, load_config, preset_names


def test_presets_load_and_round_trip(tmp_path):
    assert {"default", "wan2.1-t2v-1.3b-causal"} <= set(preset_names())
    for name in preset_names():
        config = load_config(name)
        path = tmp_path / f"{name}.toml"
        path.write_text(config.to_toml())
        assert load_config(path) == config


def test_wan_preset_matches_the_causal_systems():
    wan = load_config("wan2.1-t2v-1.3b-causal")
    assert (wan.generation.chunk_frames, wan.generation.num_inference_steps) == (3, 4)
    assert wan.model.text_encoder == "umt5" and wan.model.vae == "wan"
    assert wan.generation.sink_frames % 3 == 0 and wan.generation.window_frames % 3 == 0


@pytest.mark.parametrize(
    "data, message",
    [
        ({"generation": {"windw": 4}}, "unknown key 'windw'"),
        ({"render": {}}, "unknown table [render]"),
        ({"generation": {"fps": "fast"}}, "generation.fps must be int"),
        ({"generation": {"window_frames": 3}}, "multiple of chunk_frames"),
        ({"generation": {"sampler": "ddim"}}, "generation.sampler='ddim' is not one of"),
        ({"generation": {"addnoise_condition": 1.5}}, "addnoise_condition"),
        ({"generation": {"sink_frames": 0, "window_frames": 0}}, "sink_frames + window_frames"),
        ({"drift": {"anchor_strength": 2}}, "anchor_strength"),
        ({"runtime": {"attention_backend": "magic"}}, "attention_backend"),
        ({"model": {"vae": "sd"}}, "model.vae"),
        ({"model": {"vocabulary": "english"}}, "model.vocabulary='english' is not one of"),
        ({"model": {"trained_sizes": "64"}}, "model.trained_sizes: '64' is not WxH"),
        ({"runtime": {"sp_kind": "tree"}}, "runtime.sp_kind='tree' is not one of 'auto', 'ulysses', 'ring'"),
        ({"generation": {"shift": float("nan")}}, "generation.shift must be a finite number, got nan"),
        ({"generation": {"max_seconds": float("inf")}}, "generation.max_seconds must be a finite number"),
        ({"generation": {"guidance_scale": float("inf")}}, "generation.guidance_scale must be a finite"),
        ({"drift": {"anchor_tolerance": float("nan")}}, "drift.anchor_tolerance must be a finite number"),
        ({"generation": {"num_inference_steps": 2000}}, "exceeds generation.max_steps=1000"),
        ({"runtime": {"max_memory_gb": -1}}, "runtime.max_memory_gb must be >= 0"),
        # past their range (issue 54): a NaN or saturated video, a ZeroDivisionError, a 6.6 GB tokenizer
        ({"model": {"loras": ["a.safetensors:nan"]}}, "a LoRA's scale must be a finite number"),
        ({"model": {"loras": ["a.safetensors:-inf"]}}, "got -inf in 'a.safetensors:-inf'"),
        ({"model": {"loras": ["a.safetensors:1e308"]}}, "between -100 and 100"),
        ({"model": {"transformer_lora": "l.pt:inf"}}, "a LoRA's scale must be a finite number"),
        ({"generation": {"shift": 1e-300}}, "generation.shift must be between 0.001 and 1000"),
        ({"model": {"text_max_length": 100_000_000}}, "model.text_max_length must be at most 4096"),
    ],
)
def test_bad_values_are_named(data, message):
    with pytest.raises(ConfigError) as err:
        VidgenConfig.from_dict(data, "test.toml")
    assert message in str(err.value)


def test_overrides_and_files(tmp_path):
    config = load_config("default", **{"generation.window_frames": 8, "drift.anchor_stats": False})
    assert config.generation.window_frames == 8 and not config.drift.anchor_stats
    with pytest.raises(ConfigError, match="table.key"):
        config.replace(window_frames=4)
    with pytest.raises(ConfigError, match="unknown preset"):
        load_config("no-such-preset")
    bad = tmp_path / "bad.toml"
    bad.write_text("[generation\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")
    bad.write_bytes(b'[generation]\nnegative_prompt = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(bad)
    bad.write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(bad)
    bad.write_bytes(b"\x00" * 10)
    with pytest.raises(ConfigError, match="binary file"):
        load_config(bad)
    bad.write_bytes(b"#" * (2 << 20))
    with pytest.raises(ConfigError, match="more than the 1048576"):
        load_config(bad)


def test_config_errors_are_input_errors():
    """The API raises one documented type: a bad config value is one too."""
    import vidgen

    assert issubclass(ConfigError, vidgen.InputError) and issubclass(vidgen.InputError, ValueError)


def test_the_default_model_says_what_it_was_made_for():
    from vidgen.pipelines.loading import _folder_config, default_model_dir

    for config in (load_config("default"), _folder_config(default_model_dir())):
        assert config.model.vocabulary == "shapes_world" and config.trained_sizes() == [(64, 64)]
        assert config.runtime.sp_kind == "auto"
    wan = load_config("wan2.1-t2v-1.3b-causal")
    assert wan.model.vocabulary == "" and wan.trained_sizes() == []
    sizes = VidgenConfig.from_dict({"model": {"trained_sizes": "832x480, 480x832"}})
    assert sizes.trained_sizes() == [(832, 480), (480, 832)]


def test_choices_are_one_enum_each_and_files_hold_the_plain_word(tmp_path):
    """``generation.mode`` / ``generation.sampler`` are the enums the pipeline runs on (one
    definition each), read from the plain strings of a file and written back as plain strings."""
    from vidgen.config import GenerationMode, SamplerKind
    from vidgen.pipelines import plan, scheduler

    assert plan.GenerationMode is GenerationMode and scheduler.SamplerKind is SamplerKind
    config = load_config(
        "default", **{"generation.mode": "diffusion_forcing", "generation.sampler": "x0_renoise"}
    )
    g = config.generation
    assert g.mode is GenerationMode.DIFFUSION_FORCING and g.sampler is SamplerKind.X0_RENOISE
    assert g.mode == "diffusion_forcing" and f"{g.sampler}" == "x0_renoise"
    table = config.to_dict()["generation"]
    assert type(table["mode"]) is str and type(table["sampler"]) is str
    assert 'mode = "diffusion_forcing"' in config.to_toml().splitlines()
    path = tmp_path / "vidgen.toml"
    path.write_text(config.to_toml())
    assert load_config(path) == config
    with pytest.raises(ConfigError, match="generation.mode must be str, got int 1"):
        config.replace(**{"generation.mode": 1})
