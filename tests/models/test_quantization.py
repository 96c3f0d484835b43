"""Quantization of the transformer's linear layers (torchao): what is swapped, what it saves, how
far the output moves, and the errors a user sees."""

import sys

import pytest
import torch

from tests.tiny import TINY_TRANSFORMER, save_tiny_pipeline
from vidgen.config import ConfigError, load_config
from vidgen.models import CausalWanTransformer
from vidgen.models.quantization import QuantizationUnavailable, method, quantize_linears, weight_bytes

pytest.importorskip("torchao")

# a little wider than the shared tiny config, so that weights dominate biases and scales
GEOMETRY = {**TINY_TRANSFORMER, "attention_head_dim": 32, "ffn_dim": 256}


def _model_and_output(seed: int = 0):
    torch.manual_seed(seed)
    model = CausalWanTransformer(**GEOMETRY).eval().requires_grad_(False)
    for param in model.parameters():  # default init leaves the blocks nearly inert
        if param.ndim == 2:
            torch.nn.init.normal_(param, std=param.shape[1] ** -0.5)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 4, 2, 8, 8, generator=g)
    text = torch.randn(1, 8, 384, generator=g)
    t = torch.tensor([500.0])
    return model, lambda m: m(x, t, text).sample


def _block_linears(model):
    return {
        n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith("blocks.")
    }


@pytest.mark.parametrize(
    "kind, storage, bound", [("int8", torch.int8, 0.02), ("fp8", torch.float8_e4m3fn, 0.08)]
)
def test_quantized_blocks_store_less_and_stay_close(kind, storage, bound):
    model, run = _model_and_output()
    reference = run(model)
    blocks_before = weight_bytes(model.blocks)
    head = model.proj_out.weight.clone()

    count = quantize_linears(model, kind)

    linears = _block_linears(model)
    assert count == len(linears) == 2 * 10  # per block: q, k, v, out of self and cross attention, 2 FFN
    assert all(m.weight.qdata.dtype == storage for m in linears.values())
    assert type(model.proj_out.weight) is torch.nn.Parameter and torch.equal(model.proj_out.weight, head)
    # 1 byte a weight instead of 4, plus one scale per output row and the float32 biases
    assert weight_bytes(model.blocks) < 0.3 * blocks_before
    error = float((run(model) - reference).norm() / reference.norm())
    assert 1e-4 < error < bound, error  # moved (the weights really are quantized), but not far


def test_fp8_off_fp8_gpus_is_emulated_weight_only():
    assert method("fp8", "cpu") == "fp8 weight-only (emulated)"
    assert method("int8", "cpu") == "int8 weight-only"


def test_config_refuses_unknown_kind():
    with pytest.raises(ConfigError, match="runtime.quantize='int4' is not one of 'none', 'int8', 'fp8'"):
        load_config("default", **{"runtime.quantize": "int4"})


def test_missing_torchao_is_one_line_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)  # import raises ImportError
    model, _ = _model_and_output()
    with pytest.raises(QuantizationUnavailable, match=r"pip install 'vidgen\[quantize\]'") as info:
        quantize_linears(model, "int8")
    assert isinstance(info.value, ConfigError) and "\n" not in str(info.value)


def test_pipeline_from_config_quantizes_transformer_and_text_encoder(tmp_path):
    from vidgen.pipelines import InputError, LongVideoPipeline

    folder = save_tiny_pipeline(tmp_path / "model")
    plain = LongVideoPipeline.from_pretrained(folder, **{"runtime.autocast": "off"})
    quant = LongVideoPipeline.from_pretrained(
        folder,
        **{"runtime.autocast": "off", "runtime.quantize": "int8", "runtime.quantize_text_encoder": True},
    )
    assert all(hasattr(m.weight, "qdata") for m in _block_linears(quant.transformer).values())
    text_linears = [m for m in quant.text_encoder.modules() if isinstance(m, torch.nn.Linear)]
    assert text_linears and all(hasattr(m.weight, "qdata") for m in text_linears)
    linear_bytes = sum(
        m.weight.numel() * 4 for m in plain.text_encoder.modules() if isinstance(m, torch.nn.Linear)
    )
    saved = weight_bytes(plain.text_encoder) - weight_bytes(quant.text_encoder)
    assert 0.7 * linear_bytes < saved < 0.75 * linear_bytes  # 3 of every 4 bytes, less the scales
    kwargs = dict(num_frames=8, generator=0, output_type="np")
    a = plain("a red circle", **kwargs).frames
    b = quant("a red circle", **kwargs).frames
    assert a.shape == b.shape and 0 < abs(a - b).mean() < 0.05
    with pytest.raises(InputError, match="int8-quantized: save the float model"):
        quant.save_pretrained(tmp_path / "copy")


def test_bench_on_wan_geometry_measures_memory_and_error(tmp_path):
    import json

    from vidgen.cli import main

    argv = [
        "bench",
        "quantize",
        "--layers",
        "1",
        "--frames",
        "1",
        "--latent-side",
        "4",
        "--eval-prompts",
        "0",
    ]
    assert main([*argv, "--out-dir", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "quantize.json").read_text())["wan_geometry"]["variants"]
    assert (tmp_path / "quantize.png").stat().st_size > 0
    assert rows["float32"]["relative_error"] == 0
    # one Wan-1.3B block holds 4*1536^2*2 + 2*1536*8960 weights: ~169 MiB in float32
    assert 165 < rows["float32"]["block_MiB"] < 185
    assert rows["int8"]["block_MiB"] < 0.26 * rows["float32"]["block_MiB"]
    assert 0 < rows["bfloat16"]["relative_error"] < rows["int8"]["relative_error"] < 0.05
    assert rows["fp8"]["method"] == "fp8 weight-only (emulated)"
