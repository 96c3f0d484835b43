"""Hugging Face ids where paths are typed, resolved by the real ``huggingface_hub`` code against a hub
cache the test writes on disk (``HF_HUB_CACHE``, offline): no mock of the library."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.lora_factors import BLOCK_LINEARS, diffusers_layout, merged_by_hand, synthetic_lora
from tests.models.test_wan_checkpoint import _to_original_layout
from tests.tiny import FP32, save_tiny_pipeline
from vidgen.pipelines import LongVideoPipeline, hub
from vidgen.pipelines.hub import HubError

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def put_in_cache(cache: Path, repo_id: str, files: dict[str, Path]) -> None:
    """Lay ``files`` (path in the repository -> local file) out as ``huggingface_hub`` caches a
    download: blobs named by content, a snapshot folder of the commit, ``refs/main`` naming it."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    for name, source in files.items():
        blob = repo / "blobs" / hashlib.sha256(source.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, blob)
        target = repo / "snapshots" / COMMIT / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(blob)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "hub-cache"
    folder.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return folder


@pytest.fixture
def tiny_repo(tmp_path, cache) -> Path:
    """A tiny pipeline folder, also in the cache as ``vidgen-test/tiny-pipeline``."""
    folder = save_tiny_pipeline(tmp_path / "tiny", **FP32)
    files = {str(p.relative_to(folder)): p for p in folder.rglob("*") if p.is_file()}
    put_in_cache(cache, "vidgen-test/tiny-pipeline", files)
    return folder


def test_hub_ids_are_told_from_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.hub_reference("Wan-AI/Wan2.1-T2V-1.3B-Diffusers") == ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", None)
    assert hub.hub_reference("gdhe17/Self-Forcing/checkpoints/self_forcing_dmd.pt") == (
        "gdhe17/Self-Forcing",
        "checkpoints/self_forcing_dmd.pt",
    )
    (tmp_path / "owner" / "name").mkdir(parents=True)
    for local in ("owner/name", "./a/b", "/abs/path", "~/x/y", "default", "a:b/c"):
        assert hub.hub_reference(local) is None, local


def test_a_pipeline_loads_from_its_hub_id(tiny_repo):
    by_id = LongVideoPipeline.from_pretrained("vidgen-test/tiny-pipeline")
    local = LongVideoPipeline.from_pretrained(tiny_repo)
    a = by_id("a red circle", num_frames=9, generator=1).frames
    assert np.array_equal(a, local("a red circle", num_frames=9, generator=1).frames)


def test_a_published_checkpoint_id_is_converted_once_and_cached(tiny_repo, cache, tmp_path, monkeypatch):
    """``--transformer owner/name/file.pt`` with its key: converted into the cache, then reused."""
    base = LongVideoPipeline.from_pretrained(tiny_repo).transformer
    generator, ema = (_perturbed(base, seed) for seed in (1, 2))
    checkpoint = tmp_path / "model.pt"
    torch.save(
        {
            "generator": _to_original_layout(generator.state_dict()),
            "generator_ema": _to_original_layout(ema.state_dict()),
        },
        checkpoint,
    )
    put_in_cache(cache, "vidgen-test/causal", {"checkpoints/model.pt": checkpoint})
    overrides = {
        "model.transformer": "vidgen-test/causal/checkpoints/model.pt",
        "model.transformer_key": "generator",
    }
    pipe = LongVideoPipeline.from_pretrained("vidgen-test/tiny-pipeline", **overrides)
    for name, value in generator.state_dict().items():
        assert torch.equal(pipe.transformer.state_dict()[name], value), name
    converted = list((cache / "vidgen-converted").iterdir())
    assert len(converted) == 1 and (converted[0] / "config.json").is_file()
    # the second load reads the converted folder: converting again would fail here
    from vidgen.models import convert

    with monkeypatch.context() as patched:
        patched.setattr(convert, "convert_checkpoint", lambda *a, **k: pytest.fail("converted twice"))
        again = LongVideoPipeline.from_pretrained("vidgen-test/tiny-pipeline", **overrides)
    assert torch.equal(again.transformer.blocks[0].attn1.to_q.weight, generator.blocks[0].attn1.to_q.weight)
    # the default key is the EMA's
    ema_pipe = LongVideoPipeline.from_pretrained(
        "vidgen-test/tiny-pipeline", **{**overrides, "model.transformer_key": ""}
    )
    assert torch.equal(ema_pipe.transformer.blocks[0].attn1.to_q.weight, ema.blocks[0].attn1.to_q.weight)


def test_a_lora_id_loads_from_the_cache(tiny_repo, cache, tmp_path):
    pipe = LongVideoPipeline.from_pretrained(tiny_repo)
    lora = synthetic_lora(pipe.transformer, {"q": BLOCK_LINEARS["self_attn.q"]})
    save_file(diffusers_layout(lora), tmp_path / "adapter.safetensors")
    put_in_cache(cache, "vidgen-test/lora", {"weights/adapter.safetensors": tmp_path / "adapter.safetensors"})
    expected = merged_by_hand(pipe.transformer, lora, 0.5)
    fused = LongVideoPipeline.from_pretrained(
        tiny_repo, **{"model.loras": ["vidgen-test/lora/weights/adapter.safetensors:0.5"]}
    )
    torch.testing.assert_close(
        fused.transformer.blocks[1].attn1.to_q.weight, expected.blocks[1].attn1.to_q.weight, atol=1e-6, rtol=0
    )
    # diffusers' way: the repository, and the file as weight_name
    state = pipe.lora_state_dict("vidgen-test/lora", weight_name="weights/adapter.safetensors")
    assert set(state) == set(diffusers_layout(lora))


def test_an_id_not_in_the_cache_offline_is_one_line_exit_2(cache, capsys):
    from vidgen.cli import main

    assert main(["render", "--config", "self-forcing", "a corgi surfing at sunset", "--seconds", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Wan-AI/Wan2.1-T2V-1.3B-Diffusers" in err and "HF_HUB_OFFLINE" in err and "hf download" in err
    with pytest.raises(HubError, match="vidgen-test/causal/x.pt"):
        hub.resolve("vidgen-test/causal/x.pt")


def _perturbed(model, seed: int):
    import copy

    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    return other


def test_vidgen_render_takes_hub_ids_from_the_cache(tiny_repo, cache, tmp_path, capsys):
    """``vidgen render --model <id> --transformer <id of a .pt>``, offline, from the cache alone."""
    from vidgen.cli import main

    base = LongVideoPipeline.from_pretrained(tiny_repo).transformer
    torch.save({"generator_ema": _to_original_layout(_perturbed(base, 3).state_dict())}, tmp_path / "model.pt")
    put_in_cache(cache, "vidgen-test/causal", {"checkpoints/model.pt": tmp_path / "model.pt"})
    out = tmp_path / "video.mp4"
    args = ["render", "a red circle moving left on a black background", "--seconds", "1", "--out", str(out)]
    args += ["--model", "vidgen-test/tiny-pipeline", "--transformer", "vidgen-test/causal/checkpoints/model.pt"]
    assert main([*args, "--quiet"]) == 0, capsys.readouterr().err
    assert out.stat().st_size > 1000
    assert len(list((cache / "vidgen-converted").iterdir())) == 1
