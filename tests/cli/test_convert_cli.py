"""``vidgen convert``: synthetic checkpoints in each published layout convert to a diffusers folder
that loads to the same outputs; a checkpoint whose unpickling would run code is refused, and runs
nothing."""

import json
import os
import pickle
import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.lora_factors import BLOCK_LINEARS, merged_by_hand, original_layout, synthetic_lora
from tests.models.test_wan_checkpoint import _to_original_layout
from tests.tiny import FP32, save_tiny_pipeline
from vidgen.cli import main
from vidgen.models import CausalWanTransformer

# two heads of 128 channels: the geometry is inferred from the shapes, as for every released Wan 2.1
WAN_LIKE = dict(
    num_attention_heads=2,
    attention_head_dim=128,
    in_channels=4,
    out_channels=4,
    text_dim=16,
    freq_dim=32,
    ffn_dim=64,
    num_layers=2,
)


def _model(seed: int, **geometry) -> CausalWanTransformer:
    torch.manual_seed(seed)
    return CausalWanTransformer(**(geometry or WAN_LIKE)).eval()


def _output(model) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, model.config.in_channels, 3, 4, 4, generator=g)
    text = torch.randn(1, 5, model.config.text_dim, generator=g)
    with torch.no_grad():
        return model(x.to(model.dtype), torch.tensor([600.0]), text.to(model.dtype)).sample.float()


def _original(model, prefix: str = "model.", fsdp: bool = False) -> dict:
    """The model's weights as a training script saves them: original Wan names under ``prefix``
    (Self Forcing / CausVid / LongLive wrap the Wan model as ``model``), with FSDP's wrapper
    segments in the names when ``fsdp`` (Self Forcing's EMA: ``named_parameters`` of the FSDP module)."""
    state = _to_original_layout(model.state_dict())
    if fsdp:  # each block is an FSDP unit: blocks.0._fsdp_wrapped_module.self_attn.q.weight
        state = {re.sub(r"^(blocks\.\d+)\.", r"\1._fsdp_wrapped_module.", k): v for k, v in state.items()}
    return {prefix + k: v for k, v in state.items()}


def _convert(*args) -> int:
    return main(["convert", *map(str, args)])


def _loaded(folder) -> CausalWanTransformer:
    return CausalWanTransformer.from_pretrained(folder).eval()


LAYOUTS = {
    # Self Forcing / Rolling Forcing: trainer/distillation.py saves generator, critic, generator_ema
    "self_forcing": lambda a, b, c: {
        "generator": _original(a),
        "critic": _original(c),
        "generator_ema": _original(b, fsdp=True),
    },
    # CausVid: causvid/train_distillation.py saves generator and critic
    "causvid": lambda a, b, c: {"generator": _original(b), "critic": _original(c)},
    # LongLive base (longlive_base.pt): generator (and generator_ema when trained with EMA)
    "longlive": lambda a, b, c: {"generator": _original(b), "step": 3000},
    # a bare Wan state dict under ComfyUI's prefix
    "bare": lambda a, b, c: _original(b, prefix="model.diffusion_model."),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_published_layouts_convert_to_equal_outputs(layout, tmp_path):
    """The weights chosen by default (EMA where there is one) come out; fp32 is exact."""
    a, b, c = _model(0), _model(1), _model(2)
    torch.save(LAYOUTS[layout](a, b, c), tmp_path / "ckpt.pt")
    assert _convert(tmp_path / "ckpt.pt", tmp_path / "out", "--dtype", "fp32") == 0
    loaded = _loaded(tmp_path / "out")
    assert loaded.config.num_attention_heads == 2 and loaded.config.attention_head_dim == 128
    torch.testing.assert_close(_output(loaded), _output(b), atol=1e-6, rtol=0)
    assert (_output(a) - _output(b)).abs().max() > 1e-2  # the other weights would show


def test_key_chooses_the_weights(tmp_path):
    a, b, c = _model(0), _model(1), _model(2)
    torch.save(LAYOUTS["self_forcing"](a, b, c), tmp_path / "ckpt.pt")
    assert _convert(tmp_path / "ckpt.pt", tmp_path / "out", "--key", "generator", "--dtype", "fp32") == 0
    torch.testing.assert_close(_output(_loaded(tmp_path / "out")), _output(a), atol=1e-6, rtol=0)
    assert _convert(tmp_path / "ckpt.pt", tmp_path / "none", "--key", "optimizer") == 2


def test_bf16_keeps_the_fp32_modules(tmp_path):
    b = _model(1)
    torch.save({"generator": _original(b)}, tmp_path / "ckpt.pt")
    assert _convert(tmp_path / "ckpt.pt", tmp_path / "out") == 0  # default --dtype bf16
    (weights,) = (tmp_path / "out").glob("*.safetensors")
    stored = load_file(weights)
    assert stored["blocks.0.attn1.to_q.weight"].dtype == torch.bfloat16
    assert stored["condition_embedder.time_embedder.linear_1.weight"].dtype == torch.float32
    assert stored["blocks.0.scale_shift_table"].dtype == torch.float32
    loaded = CausalWanTransformer.from_pretrained(tmp_path / "out", torch_dtype=torch.bfloat16)
    torch.testing.assert_close(_output(loaded), _output(b), atol=0.05, rtol=0.05)  # bf16 rounding


def test_longlive_base_plus_lora(tmp_path):
    """LongLive ships longlive_base.pt and a rank-256 lora.pt; convert fuses the LoRA in."""
    base = _model(1)
    lora = synthetic_lora(base, BLOCK_LINEARS)
    torch.save({"generator": _original(base)}, tmp_path / "longlive_base.pt")
    torch.save(
        {"generator_lora": original_layout(lora, "base_model.model.", with_alpha=False), "step": 1},
        tmp_path / "lora.pt",
    )
    args = [
        tmp_path / "longlive_base.pt",
        tmp_path / "out",
        "--lora",
        tmp_path / "lora.pt",
        "--dtype",
        "fp32",
    ]
    assert _convert(*args) == 0
    expected = _output(merged_by_hand(base, lora))
    assert (expected - _output(base)).abs().max() > 1e-2
    torch.testing.assert_close(_output(_loaded(tmp_path / "out")), expected, atol=1e-5, rtol=0)
    # a scale after the path, as everywhere else
    assert _convert(*args[:3], f"{tmp_path / 'lora.pt'}:0.5", "--dtype", "fp32", "--force") == 0
    half = _output(merged_by_hand(base, lora, 0.5))
    torch.testing.assert_close(_output(_loaded(tmp_path / "out")), half, atol=1e-5, rtol=0)


def test_geometry_from_a_config_when_heads_are_not_128(tmp_path, capsys):
    geometry = dict(WAN_LIKE, attention_head_dim=12)  # 24 channels: not 128-channel heads
    b = _model(1, **geometry)
    torch.save({"generator": _original(b)}, tmp_path / "ckpt.pt")
    assert _convert(tmp_path / "ckpt.pt", tmp_path / "out") == 2
    assert "128-channel heads" in capsys.readouterr().err
    # diffusers' names (a transformer/config.json) or Wan's (dim, num_heads)
    (tmp_path / "diffusers.json").write_text(json.dumps(dict(b.config)))
    (tmp_path / "wan.json").write_text(json.dumps({"dim": 24, "num_heads": 2, "model_type": "t2v"}))
    for i, config in enumerate(["diffusers.json", "wan.json"]):
        out = tmp_path / f"out{i}"
        assert _convert(tmp_path / "ckpt.pt", out, "--config", tmp_path / config, "--dtype", "fp32") == 0
        torch.testing.assert_close(_output(_loaded(out)), _output(b), atol=1e-6, rtol=0)


def test_a_published_wan_config_json_converts_as_it_is(tmp_path, capsys):
    """Wan 2.1's config.json as released (Wan's names, ``text_len``, ``qk_norm: true``) with the
    causal repositories' window keys: the geometry is read from it, the rest reported and ignored."""
    geometry = dict(WAN_LIKE, attention_head_dim=12)  # not 128-channel heads: the config decides
    b = _model(1, **geometry)
    torch.save({"generator": _original(b)}, tmp_path / "ckpt.pt")
    published = {
        "_class_name": "WanModel", "_diffusers_version": "0.30.0", "model_type": "t2v",
        "dim": 24, "num_heads": 2, "num_layers": geometry["num_layers"], "ffn_dim": geometry["ffn_dim"],
        "freq_dim": geometry["freq_dim"], "in_dim": geometry["in_channels"], "out_dim": geometry["out_channels"],
        "eps": 1e-6, "text_len": 512, "window_size": [-1, -1], "qk_norm": True, "cross_attn_norm": True,
        "local_attn_size": 12, "sink_size": 3,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(published))
    assert (
        _convert(
            tmp_path / "ckpt.pt", tmp_path / "out", "--config", tmp_path / "config.json", "--dtype", "fp32"
        )
        == 0
    )
    torch.testing.assert_close(_output(_loaded(tmp_path / "out")), _output(b), atol=1e-6, rtol=0)
    err = capsys.readouterr().err
    for key in ("text_len", "window_size", "local_attn_size", "sink_size"):
        assert key in err.split("not used")[1], err
    assert "model_type" not in err.split("not used")[1] and "num_heads" not in err
    # a key that is geometry is used: 3 layers do not fit these weights' 2
    (tmp_path / "config.json").write_text(json.dumps(dict(published, num_layers=3)))
    assert _convert(tmp_path / "ckpt.pt", tmp_path / "o2", "--config", tmp_path / "config.json") == 2
    assert "num_layers is 3 but the weights have 2" in capsys.readouterr().err
    # not a JSON object: one line
    (tmp_path / "list.json").write_text("[1, 2]")
    assert _convert(tmp_path / "ckpt.pt", tmp_path / "o3", "--config", tmp_path / "list.json") == 2
    assert "JSON object" in capsys.readouterr().err


def test_transformer_flag_loads_the_converted_folder(tmp_path):
    from vidgen.cli import build_parser
    from vidgen.cli.render import load_pipeline

    folder = save_tiny_pipeline(tmp_path / "model", **FP32)
    other = CausalWanTransformer.from_pretrained(folder / "transformer")
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.01 * torch.randn_like(p))
    torch.save({"generator_ema": _original(other)}, tmp_path / "ckpt.pt")
    config = folder / "transformer" / "config.json"
    assert _convert(tmp_path / "ckpt.pt", tmp_path / "out", "--config", config, "--dtype", "fp32") == 0
    args = build_parser().parse_args(
        ["render", "x", "--model", str(folder), "--transformer", str(tmp_path / "out")]
    )
    pipe = load_pipeline(args)
    torch.testing.assert_close(_output(pipe.transformer), _output(other), atol=1e-6, rtol=0)


class _Payload:
    """Unpickled, it creates a folder: stands for any code a pickle can run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"generator": _original(_model(0)), "extra": _Payload(str(marker))}, tmp_path / "evil.pt")
    (tmp_path / "raw.pt").write_bytes(pickle.dumps({"generator": _Payload(str(marker))}))  # not a zip
    errors = {}
    for name in ("evil.pt", "raw.pt"):
        cmd = [sys.executable, "-m", "vidgen", "convert", str(tmp_path / name), str(tmp_path / "out")]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and "refused" in result.stderr, result.stderr
        assert not marker.exists() and not (tmp_path / "out").exists()
        errors[name] = result.stderr
    assert "mkdir" in errors["evil.pt"]  # the reason names the call the file asked for
    # the LoRA reader is the same: LongVideoPipeline.load_lora_weights / --lora refuse it too
    from vidgen.models.lora import read_lora_file

    with pytest.raises(ValueError, match="arbitrary unpickling"):
        read_lora_file(tmp_path / "evil.pt")
    assert not marker.exists()
    torch.load(tmp_path / "evil.pt", weights_only=False)  # the payload is live: unsafe loading runs it
    assert marker.exists()
