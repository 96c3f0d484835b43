"""``vidgen train average``: a model soup of pipeline folders of one architecture, the transformer
weights' mean stored in float16, the first folder's other parts kept; other architectures and
writing over an input are refused."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.tiny import FP32, save_tiny_pipeline
from vidgen.pipelines import LongVideoPipeline
from vidgen.training.export import average_pipelines

WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"


def test_average_is_the_transformers_mean(tmp_path):
    folders = [save_tiny_pipeline(tmp_path / f"p{seed}", seed=seed, **FP32) for seed in (1, 2)]
    out = tmp_path / "soup"
    cli = subprocess.run(
        [sys.executable, "-m", "vidgen", "train", "average", *map(str, folders), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0, cli.stderr
    a, b = (load_file(str(f / WEIGHTS)) for f in folders)
    soup = load_file(str(out / WEIGHTS))
    assert soup.keys() == a.keys()
    for name, value in soup.items():
        assert value.dtype == torch.float16
        torch.testing.assert_close(value, ((a[name].float() + b[name].float()) / 2).half(), atol=0, rtol=0)
    # the seeds differ: the mean is neither of them
    assert any(not torch.allclose(soup[n].float(), a[n].float(), atol=1e-3) for n in soup)
    # the first folder's other parts and settings; the pipeline loads and says where it came from
    assert (out / "vidgen.toml").read_text() == (folders[0] / "vidgen.toml").read_text()
    assert (
        load_file(str(out / "vae/diffusion_pytorch_model.safetensors")).keys()
        == load_file(str(folders[0] / "vae/diffusion_pytorch_model.safetensors")).keys()
    )
    pipe = LongVideoPipeline.from_pretrained(str(out))
    loaded = {k: v.float() for k, v in pipe.transformer.state_dict().items()}
    torch.testing.assert_close(loaded[next(iter(soup))], soup[next(iter(soup))].float())
    state = json.loads((out / "training_state.json").read_text())
    assert state["averaged_from"] == [str(f) for f in folders]


def test_average_refuses_other_architectures_and_its_own_inputs(tmp_path):
    two = save_tiny_pipeline(tmp_path / "two", seed=1, heads=2, **FP32)
    three = save_tiny_pipeline(tmp_path / "three", seed=1, heads=3, **FP32)
    with pytest.raises(ValueError, match="num_attention_heads"):
        average_pipelines([two, three], tmp_path / "soup")
    with pytest.raises(ValueError, match="at least two"):
        average_pipelines([two], tmp_path / "soup")
    with pytest.raises(ValueError, match="elsewhere"):
        average_pipelines([two, two], two)
    with pytest.raises(FileNotFoundError, match="transformer"):
        average_pipelines([two, tmp_path], tmp_path / "soup")
