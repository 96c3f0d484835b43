"""``runtime.sp_kind`` (``--sp-kind``): ``auto`` takes Ulysses when the heads divide by sp and ring
otherwise, so ``--sp 2`` runs on a model with 3 heads (the default model's count)."""

from __future__ import annotations

import pytest

from tests.distributed.launch import run_ranks
from tests.tiny import FP32, save_tiny_pipeline
from vidgen.distributed.sequence_parallel import resolve_kind


def test_resolve_kind():
    assert resolve_kind("auto", 3, 2) == "ring"
    assert resolve_kind("auto", 4, 2) == "ulysses"
    assert resolve_kind("auto", 3, 1) == "ulysses"
    assert resolve_kind("ring", 4, 2) == "ring" and resolve_kind("ulysses", 3, 2) == "ulysses"
    with pytest.raises(ValueError, match="choose auto or one of ulysses, ring"):
        resolve_kind("tree", 4, 2)


def _worker_rank(rank, world_size, init_method, folder, kind, results):
    from vidgen.distributed.ray_worker import PipelineSpec, PipelineWorker
    from vidgen.request import GenerationRequest

    overrides = {"runtime.sp_kind": kind} if kind else {}
    worker = PipelineWorker(
        PipelineSpec(model=str(folder / "model"), overrides=overrides), rank, world_size, init_method
    )
    if worker._init_error is not None:
        (folder / f"{kind}.rank{rank}").write_text(f"error: {worker._init_error}")
        return
    request = GenerationRequest(prompt="a red circle moving left on a black background", seconds=0.5, seed=1)
    frames = sum(len(c.frames) for c in worker.stream(request, str(folder / f"work{rank}")))
    (folder / f"{kind}.rank{rank}").write_text(f"{worker.group.kind} {frames}")
    worker.close()


@pytest.mark.parametrize("kind", ["auto", "ulysses"])
def test_sp2_on_three_heads(tmp_path, kind):
    save_tiny_pipeline(tmp_path / "model", heads=3, **FP32)
    run_ranks(_worker_rank, 2, tmp_path, kind, None)
    rank0 = (tmp_path / f"{kind}.rank0").read_text()
    if kind == "auto":
        assert rank0 == "ring 8"  # rank 0 yields the chunks; the others none
        assert (tmp_path / "auto.rank1").read_text() == "ring 0"
    else:
        assert rank0.startswith("error: Ulysses sequence parallelism splits the 3 attention heads")
        assert "--sp-kind ring or auto" in rank0


def test_the_cli_flag_reaches_every_worker_spec():
    """``--sp-kind`` becomes ``runtime.sp_kind`` in the spec that one video's ranks and the
    replicas of ``--jobs`` load; without it the config's own (``auto``) holds."""
    import argparse

    from vidgen.cli.render_ray import pipeline_spec

    args = argparse.Namespace(model=None, config=None, set=[], fps=None, transformer=None, sp_kind="ring")
    assert pipeline_spec(args).overrides == {"runtime.sp_kind": "ring"}
    args.sp_kind = None
    assert "runtime.sp_kind" not in pipeline_spec(args).overrides
