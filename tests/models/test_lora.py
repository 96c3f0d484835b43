"""LoRA layouts on the causal transformer: each published layout, loaded through diffusers'
``PeftAdapterMixin``, gives the output of weights merged by hand (W + scale * alpha / r * B @ A),
unfused and fused, within 1e-5 (tiny random model, CPU, fp32; reference merged in float64)."""

import copy

import pytest
import torch

from tests.lora_factors import (
    BLOCK_LINEARS,
    diffusers_layout,
    merged_by_hand,
    original_layout,
    synthetic_lora,
)
from vidgen.models import CausalWanTransformer
from vidgen.models.lora import check_lora_keys, normalize_lora_state_dict, read_lora_file

from .conftest import TINY

TOL = 1e-5


def _model() -> CausalWanTransformer:
    torch.manual_seed(0)
    return CausalWanTransformer(**TINY).eval()


def _inputs():
    g = torch.Generator().manual_seed(1)
    return (
        torch.randn(1, 4, 3, 8, 8, generator=g),
        torch.tensor([700.0]),
        torch.randn(1, 5, TINY["text_dim"], generator=g),
    )


def _output(model) -> torch.Tensor:
    with torch.no_grad():
        return model(*_inputs()).sample


def assert_matches_hand_merge(model, lora, load) -> None:
    """``load(model)`` puts the LoRA in; unfused, weighted, fused and unfused again, the output is the
    hand-merged model's; unloaded, the base model's."""
    pristine = copy.deepcopy(model)
    base = _output(model)
    expected = _output(merged_by_hand(pristine, lora))
    assert (expected - base).abs().max() > 1e-2  # the LoRA changes the output: the comparison has teeth

    name = load(model)
    torch.testing.assert_close(_output(model), expected, atol=TOL, rtol=0)  # unfused
    model.set_adapters([name], [0.5])
    torch.testing.assert_close(_output(model), _output(merged_by_hand(pristine, lora, 0.5)), atol=TOL, rtol=0)
    model.set_adapters([name], [1.0])
    model.fuse_lora(lora_scale=0.7)
    assert all(m.merged for m in model.modules() if hasattr(m, "lora_A"))  # really in the weights now
    torch.testing.assert_close(_output(model), _output(merged_by_hand(pristine, lora, 0.7)), atol=TOL, rtol=0)
    model.unfuse_lora()  # as in diffusers, the adapter keeps the scale it was fused with
    torch.testing.assert_close(_output(model), _output(merged_by_hand(pristine, lora, 0.7)), atol=TOL, rtol=0)
    model.set_adapters([name], [1.0])
    torch.testing.assert_close(_output(model), expected, atol=TOL, rtol=0)
    model.unload_lora()
    torch.testing.assert_close(_output(model), base, atol=TOL, rtol=0)


def _adapter(state):
    def load(model):
        normalized = normalize_lora_state_dict(state)
        check_lora_keys(model, normalized)
        model.load_lora_adapter(normalized, adapter_name="x")
        return "x"

    return load


def test_diffusers_layout_matches_hand_merge():
    model = _model()
    lora = synthetic_lora(model, {"q": "attn1.to_q", "o": "attn2.to_out.0", "f": "ffn.net.2"})
    assert_matches_hand_merge(model, lora, _adapter(diffusers_layout(lora)))


def test_diffusers_layout_with_alpha_keys():
    model = _model()
    lora = synthetic_lora(model, {"k": "attn1.to_k", "f": "ffn.net.0.proj"}, alpha=8.0)  # twice r
    assert_matches_hand_merge(model, lora, _adapter(diffusers_layout(lora, with_alpha=True)))


@pytest.mark.parametrize("prefix", ["", "diffusion_model.", "base_model.model."])
def test_original_layout_with_alpha_matches_hand_merge(prefix):
    """alpha = 2 on rank 4: the LoRA acts at half strength (diffusers' converter folds alpha / r)."""
    model = _model()
    lora = synthetic_lora(model, BLOCK_LINEARS, alpha=2.0)
    assert_matches_hand_merge(model, lora, _adapter(original_layout(lora, prefix, with_alpha=True)))


def test_original_layout_lora_down_up_without_alpha():
    model = _model()
    lora = synthetic_lora(model, {"self_attn.v": "attn1.to_v", "cross_attn.k": "attn2.to_k"})
    state = original_layout(lora, "diffusion_model.", with_alpha=False, names=("lora_down", "lora_up"))
    assert_matches_hand_merge(model, lora, _adapter(state))


def test_longlive_lora_pt_matches_hand_merge(tmp_path):
    """LongLive's ``lora.pt``: ``{"generator_lora": peft keys of the original model, "critic_lora": ...,
    "step": N}``, every linear layer of every block, alpha = rank (no alpha keys)."""
    model = _model()
    lora = synthetic_lora(model, BLOCK_LINEARS)
    generator = original_layout(lora, "base_model.model.", with_alpha=False)
    critic = {k: torch.zeros_like(v) for k, v in generator.items()}
    torch.save({"generator_lora": generator, "critic_lora": critic, "step": 3000}, tmp_path / "lora.pt")
    assert_matches_hand_merge(model, lora, _adapter(read_lora_file(tmp_path / "lora.pt")))


def test_unknown_keys_are_named():
    model = _model()
    lora = synthetic_lora(model, {"q": "attn1.to_q"})
    state = original_layout(lora, "diffusion_model.", with_alpha=False)
    state["diffusion_model.blocks.0.self_attn.norm_q.lora_A.weight"] = torch.zeros(4, 24)
    with pytest.raises(ValueError, match=r"blocks\.0\.self_attn\.norm_q\.lora_A\.weight"):
        normalize_lora_state_dict(state)

    state = diffusers_layout(lora)
    state["transformer.blocks.5.attn1.to_q.lora_A.weight"] = torch.zeros(4, 24)  # no block 5
    state["transformer.blocks.0.attn1.norm_q.lora_A.weight"] = torch.zeros(4, 24)  # not a linear layer
    with pytest.raises(
        ValueError, match=r"blocks\.5\.attn1\.to_q.*blocks\.0\.attn1\.norm_q|norm_q.*blocks\.5"
    ):
        check_lora_keys(model, normalize_lora_state_dict(state))


def test_wrong_rank_shapes_are_named():
    model = _model()
    lora = synthetic_lora(model, {"q": "attn1.to_q"})
    state = diffusers_layout(lora)
    state["transformer.blocks.0.attn1.to_q.lora_A.weight"] = torch.zeros(4, 99)
    with pytest.raises(ValueError, match=r"blocks\.0\.attn1\.to_q\.lora_A\.weight \(4, 99\)"):
        check_lora_keys(model, state)
