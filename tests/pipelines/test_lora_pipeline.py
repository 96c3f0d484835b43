"""LoRA on ``LongVideoPipeline`` as in diffusers' Wan pipelines, and from every surface that builds a
pipeline from the config: ``[model] loras``, ``vidgen render --lora``, the live page, Ray workers.

References are pipelines whose transformer weights were merged by hand (W + scale * alpha/r * B @ A)."""

import copy
import subprocess
import sys

import pytest
import torch

from tests.lora_factors import merged_by_hand, original_layout, synthetic_lora
from tests.tiny import FP32, save_tiny_pipeline, tiny_components
from vidgen.config import load_config
from vidgen.pipelines import InputError, LongVideoPipeline, ModelLoadError

PROMPT = "a red circle moving left"
# the cross-attention keys/values are cached per prompt: a LoRA on them must invalidate that cache
TARGETS = {"cross_attn.k": "attn2.to_k", "cross_attn.v": "attn2.to_v", "self_attn.q": "attn1.to_q"}
TOL = 1e-4  # latents after 4 sampler steps x 2 chunks of the tiny model (transformer level: 1e-5)


def _latents(pipe) -> torch.Tensor:
    return pipe(PROMPT, num_frames=9, generator=3, output_type="latent").frames


def _with_transformer(transformer) -> LongVideoPipeline:
    pipe = tiny_components(**FP32)
    pipe.transformer = transformer.eval()
    return pipe


@pytest.fixture(scope="module")
def lora():
    return synthetic_lora(tiny_components(**FP32).transformer, TARGETS, alpha=2.0)


@pytest.fixture(scope="module")
def lora_file(lora, tmp_path_factory):
    """A LongLive-style ``lora.pt``."""
    path = tmp_path_factory.mktemp("lora") / "lora.pt"
    torch.save({"generator_lora": original_layout(lora, "base_model.model.", with_alpha=True)}, path)
    return path


def test_pipeline_lora_methods_match_hand_merge(lora, lora_file):
    pipe = tiny_components(**FP32)
    pristine = copy.deepcopy(pipe.transformer)
    base = _latents(pipe)  # fills the prompt's cached cross-attention context
    expected = _latents(_with_transformer(merged_by_hand(pristine, lora)))
    half = _latents(_with_transformer(merged_by_hand(pristine, lora, 0.5)))
    assert (expected - base).abs().max() > 1e-2

    pipe.load_lora_weights(str(lora_file), adapter_name="style")
    torch.testing.assert_close(_latents(pipe), expected, atol=TOL, rtol=0)
    assert pipe.get_list_adapters() == {"transformer": ["style"]}
    pipe.set_adapters(["style"], [0.5])
    torch.testing.assert_close(_latents(pipe), half, atol=TOL, rtol=0)
    pipe.set_adapters("style", 1.0)
    pipe.fuse_lora(lora_scale=0.5)
    assert pipe.num_fused_loras == 1
    torch.testing.assert_close(_latents(pipe), half, atol=TOL, rtol=0)
    pipe.unfuse_lora()
    pipe.set_adapters("style", 1.0)
    torch.testing.assert_close(_latents(pipe), expected, atol=TOL, rtol=0)
    pipe.unload_lora_weights()
    torch.testing.assert_close(_latents(pipe), base, atol=TOL, rtol=0)


def test_save_with_fused_lora(lora, tmp_path):
    """Saved after fuse + unload, the pipeline reloads with the LoRA in its weights; with adapters
    still loaded, saving is refused (peft's wrapped layers would be written under other names)."""
    pipe = tiny_components(**FP32)
    expected = _latents(_with_transformer(merged_by_hand(copy.deepcopy(pipe.transformer), lora)))
    pipe.load_lora_weights(original_layout(lora, "", with_alpha=True))
    with pytest.raises(InputError, match="unload_lora_weights"):
        pipe.save_pretrained(tmp_path / "saved")
    pipe.fuse_lora()
    pipe.unload_lora_weights()
    pipe.save_pretrained(tmp_path / "saved")
    torch.testing.assert_close(
        _latents(LongVideoPipeline.from_pretrained(tmp_path / "saved")), expected, atol=TOL, rtol=0
    )


def test_two_adapters_weighted(lora):
    pipe = tiny_components(**FP32)
    pristine = copy.deepcopy(pipe.transformer)
    other = synthetic_lora(pristine, {"ffn.0": "ffn.net.0.proj", "self_attn.q": "attn1.to_q"}, seed=5)
    pipe.load_lora_weights(original_layout(lora, "diffusion_model.", with_alpha=True))  # default_0
    pipe.load_lora_weights(original_layout(other, "", with_alpha=False), adapter_name="b")
    pipe.set_adapters(["default_0", "b"], [0.3, 0.8])
    both = merged_by_hand(merged_by_hand(pristine, lora, 0.3), other, 0.8)
    torch.testing.assert_close(_latents(pipe), _latents(_with_transformer(both)), atol=TOL, rtol=0)


def test_unknown_keys_are_a_load_error_naming_them():
    pipe = tiny_components(**FP32)
    state = {"transformer.blocks.0.attn1.to_q.lora_A.weight": torch.zeros(4, 32)}
    state["transformer.blocks.0.norm3.lora_A.weight"] = torch.zeros(4, 32)
    with pytest.raises(ModelLoadError, match=r"blocks\.0\.norm3\.lora_A\.weight"):
        pipe.load_lora_weights(state)
    assert not pipe.get_list_adapters()  # nothing half-loaded


# ------------------------------------------------------------------ from the config


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_tiny_pipeline(tmp_path_factory.mktemp("tiny") / "model", **FP32)


@pytest.fixture(scope="module")
def config_with_lora(model, lora_file, tmp_path_factory):
    config = load_config(model / "vidgen.toml").replace(**{"model.loras": [f"{lora_file}:0.5"]})
    path = tmp_path_factory.mktemp("config") / "with_lora.toml"
    path.write_text(config.to_toml())
    return path


@pytest.fixture(scope="module")
def reference(model, lora):
    """The folder's transformer with the LoRA merged by hand at scale 0.5."""
    return merged_by_hand(LongVideoPipeline.from_pretrained(model).transformer, lora, 0.5)


def assert_fused_at_half(pipe, reference, lora):
    """The config's LoRA is in the weights (at scale 0.5), its layers gone."""
    assert not any(hasattr(m, "lora_A") for m in pipe.transformer.modules())
    for name in lora:
        got, want = pipe.transformer.get_submodule(name).weight, reference.get_submodule(name).weight
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_config_loras_are_fused_at_load(model, config_with_lora, lora, reference, tmp_path):
    assert load_config(config_with_lora).model.loras[0].endswith("lora.pt:0.5")  # the TOML round trip
    pipe = LongVideoPipeline.from_pretrained(model, config=str(config_with_lora))
    assert_fused_at_half(pipe, reference, lora)
    # saved, the fused transformer is the model: the LoRA is not listed again (nor applied twice)
    pipe.save_pretrained(tmp_path / "saved")
    again = LongVideoPipeline.from_pretrained(tmp_path / "saved")
    assert again.config.model.loras == []
    assert_fused_at_half(again, reference, lora)


def test_render_lora_flag(model, lora_file, lora, reference):
    from vidgen.cli import build_parser
    from vidgen.cli.render import load_pipeline

    args = build_parser().parse_args(["render", "x", "--model", str(model), "--lora", f"{lora_file}:0.5"])
    assert_fused_at_half(load_pipeline(args), reference, lora)


def test_live_page_and_ray_workers_load_the_config_loras(model, config_with_lora, lora, lora_file, reference):
    from vidgen.cli import build_parser
    from vidgen.cli.render_ray import pipeline_spec
    from vidgen.distributed.ray_worker import PipelineSpec
    from vidgen.ui.app import open_backend

    sessions, _info = open_backend("local", str(model), str(config_with_lora))
    assert_fused_at_half(sessions.pipe, reference, lora)
    # what every Ray worker runs (vidgen serve --backend ray deploys the same PipelineSpec)
    assert_fused_at_half(PipelineSpec(model=str(model), config=str(config_with_lora)).load(), reference, lora)
    args = build_parser().parse_args(["render", "x", "--model", str(model), "--lora", f"{lora_file}:0.5"])
    assert_fused_at_half(pipeline_spec(args).load(), reference, lora)


def test_render_with_a_bad_lora_is_one_line_exit_2(model, tmp_path):
    bad = tmp_path / "bad.safetensors"
    from safetensors.torch import save_file

    save_file({"blocks.0.self_attn.nope.lora_A.weight": torch.zeros(2, 2)}, str(bad))
    cmd = [sys.executable, "-m", "vidgen", "render", "x", "--model", str(model), "--lora", str(bad)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "blocks.0.self_attn.nope.lora_A.weight" in result.stderr
    missing = subprocess.run(
        [*cmd[:-1], str(tmp_path / "none.pt")], capture_output=True, text=True, timeout=300
    )
    assert missing.returncode == 2 and "--lora: no file at" in missing.stderr
