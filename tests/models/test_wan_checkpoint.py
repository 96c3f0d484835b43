"""Loading Wan 2.1 checkpoints: diffusers directories (plain and sharded) and the original key layout."""

import json

import pytest
import torch
from diffusers import WanTransformer3DModel
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
from safetensors.torch import save_file

from tests.models.conftest import TINY, relative_error
from vidgen.models import CausalWanTransformer
from vidgen.models.wan_checkpoint import convert_original_state_dict


def _to_original_layout(state):
    """Original Wan names, written out by hand here (independent of the code under test)."""
    renames = [
        ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
        ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
        ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
        ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
        ("condition_embedder.time_proj", "time_projection.1"),
        ("attn1.to_out.0", "self_attn.o"),
        ("attn2.to_out.0", "cross_attn.o"),
        ("attn1.to_", "self_attn."),
        ("attn2.to_", "cross_attn."),
        ("attn1.", "self_attn."),
        ("attn2.", "cross_attn."),
        (".norm2.", ".norm3."),
        ("ffn.net.0.proj", "ffn.0"),
        ("ffn.net.2", "ffn.2"),
        (".scale_shift_table", ".modulation"),
    ]
    out = {}
    for key, value in state.items():
        if key == "scale_shift_table":
            key = "head.modulation"
        elif key.startswith("proj_out"):
            key = key.replace("proj_out", "head.head")
        for old, new in renames:
            key = key.replace(old, new)
        out[key] = value.clone()
    return out


@pytest.fixture
def reference():
    return WanTransformer3DModel(**TINY).eval()


def _inputs():
    return torch.randn(1, 4, 3, 4, 6), torch.tensor([250.0]), torch.randn(1, 7, TINY["text_dim"])


def _same_output(model, reference):
    x, t, text = _inputs()
    with torch.no_grad():
        return relative_error(model(x, t, text).sample, reference(x, t, text).sample) <= 1e-5


@pytest.mark.parametrize("shard", [None, "20KB"])
def test_loads_diffusers_directory(tmp_path, reference, shard):
    kwargs = {"max_shard_size": shard} if shard else {}
    reference.save_pretrained(tmp_path / "wan", **kwargs)
    model = CausalWanTransformer.from_pretrained(tmp_path / "wan")
    assert _same_output(model, reference)


def test_save_pretrained_round_trips(tmp_path, reference):
    model = CausalWanTransformer(**TINY)
    model.load_state_dict(reference.state_dict())
    model.save_pretrained(tmp_path / "ours")
    again = CausalWanTransformer.from_pretrained(tmp_path / "ours")
    assert _same_output(again, reference)
    # and diffusers reads what we write
    theirs = WanTransformer3DModel.from_pretrained(tmp_path / "ours")
    assert _same_output(model, theirs)


@pytest.mark.parametrize("prefix", ["", "model.", "model.diffusion_model."])
def test_loads_original_wan_layout(tmp_path, reference, prefix):
    original = {prefix + k: v for k, v in _to_original_layout(reference.state_dict()).items()}
    save_file(original, str(tmp_path / "wan.safetensors"))
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"dim": 24, "num_heads": 2, "num_layers": 2, "ffn_dim": 32, "freq_dim": 32, "model_type": "t2v"}
        )
    )
    model = CausalWanTransformer.from_pretrained(
        tmp_path / "wan.safetensors", config_overrides={"rope_max_seq_len": 64}
    )
    assert model.config.num_attention_heads == 2 and model.config.num_layers == 2
    assert _same_output(model, reference)


def test_conversion_agrees_with_diffusers_converter(reference):
    original = {
        "model.diffusion_model." + k: v for k, v in _to_original_layout(reference.state_dict()).items()
    }
    ours = convert_original_state_dict(dict(original))
    theirs = convert_wan_transformer_to_diffusers(dict(original))
    assert set(ours) == set(theirs) == set(reference.state_dict())


def test_missing_and_pickled_checkpoints_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloads"):
        CausalWanTransformer.from_pretrained(tmp_path / "absent")
    (tmp_path / "pickled").mkdir()
    torch.save({"w": torch.zeros(1)}, tmp_path / "pickled" / "model.pt")
    with pytest.raises(FileNotFoundError, match="convert it with `vidgen convert`"):
        CausalWanTransformer.from_pretrained(tmp_path / "pickled")
    with pytest.raises(ValueError, match="only .safetensors"):
        CausalWanTransformer.from_pretrained(tmp_path / "pickled" / "model.pt")


def test_corrupt_file_is_a_clear_error(tmp_path):
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(Exception, match="bad.safetensors"):
        CausalWanTransformer.from_pretrained(tmp_path / "bad.safetensors")
