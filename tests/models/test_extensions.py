"""The Wan class computes Wan alone; the default model's additions live in their own class, chosen
by the config keys that switch them on (vidgen.models.extensions)."""

from __future__ import annotations

import torch

from vidgen.models import CausalWanTransformer
from vidgen.models.extensions import ConditionedWanTransformer

TINY = dict(
    patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
    text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, rope_max_seq_len=64,
)  # fmt: skip
ADDITIONS = {"spatial_pos_grid": (3, 4), "text_modulation": True, "text_velocity": True}


def _output(model) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 4, 3, 6, 8, generator=g)
    text = torch.randn(1, 5, 32, generator=g)
    with torch.no_grad():
        return model(x, torch.tensor([[900.0, 500.0, 100.0]]), text).sample


def test_the_config_keys_choose_the_class(tmp_path):
    wan = CausalWanTransformer(**TINY)
    assert type(wan) is CausalWanTransformer and not hasattr(wan, "spatial_pos")
    for key, value in ADDITIONS.items():
        assert type(CausalWanTransformer(**TINY, **{key: value})) is ConditionedWanTransformer, key
    torch.manual_seed(0)
    conditioned = CausalWanTransformer(**TINY, **ADDITIONS).eval()
    with torch.no_grad():
        for p in (
            conditioned.spatial_pos,
            conditioned.velocity_gain,
            *conditioned.text_to_modulation.parameters(),
        ):
            p.normal_(0, 0.1)  # the additions on: not their zero start
    conditioned.save_pretrained(tmp_path / "m")
    for loaded in (
        CausalWanTransformer.from_pretrained(tmp_path / "m"),
        CausalWanTransformer.from_config(CausalWanTransformer.load_config(tmp_path / "m")),
    ):
        assert type(loaded) is ConditionedWanTransformer
    loaded = CausalWanTransformer.from_pretrained(tmp_path / "m").eval()
    # the same weights (a loaded model's matmuls may round 1e-7 apart: other memory layout)
    torch.testing.assert_close(_output(loaded), _output(conditioned), rtol=0, atol=1e-5)
    assert (_output(conditioned) - _output(_wan_of(conditioned))).abs().max() > 1e-2  # they add something


def test_additions_at_their_zero_start_compute_wan_bit_for_bit():
    """What the variant adds goes through the hooks only: zero additions leave Wan's numbers."""
    torch.manual_seed(0)
    conditioned = ConditionedWanTransformer(**TINY, **ADDITIONS).eval()
    assert torch.equal(_output(conditioned), _output(_wan_of(conditioned)))


def test_a_model_declares_its_vocabulary(tmp_path, monkeypatch):
    """``model.vocabulary`` names the module that checks prompts: the session code imports none."""
    from vidgen.config import load_config
    from vidgen.pipelines.session import fit_warnings

    (tmp_path / "colours_only.py").write_text(
        "def prompt_warning(prompt):\n    return None if 'red' in prompt else f'no colour in {prompt!r}'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = load_config("wan2.1-t2v-1.3b-causal").replace(**{"model.vocabulary": "colours_only"})
    assert fit_warnings(config, ["a red fox", "a fox"], 480, 832) == ["no colour in 'a fox'"]
    shapes = load_config("default")  # the embedded model's own: Shapes World
    prompt = "a red circle moving left on a black background"
    assert fit_warnings(shapes, ["a corgi"], 64, 64) and not fit_warnings(shapes, [prompt], 64, 64)


def _wan_of(model) -> CausalWanTransformer:
    wan = CausalWanTransformer(**TINY).eval()
    missing, _ = wan.load_state_dict(model.state_dict(), strict=False)
    assert not missing
    return wan
