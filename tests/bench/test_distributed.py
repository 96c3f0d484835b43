"""``vidgen bench distributed``: the Wan-1.3B projection (fast) and the measured SP=2 run (slow)."""

from __future__ import annotations

import json

import pytest

from vidgen.bench.distributed import WAN_1_3B, chunk_flops, projection, volume_per_rank
from vidgen.cli import main


def test_projection_counts_four_all_to_alls_per_layer_for_ulysses():
    volume, _ = volume_per_rank(WAN_1_3B, 1560, 3, 12, 2, "ulysses", 2, 1)
    dim = 12 * 128
    all_to_alls = 30 * 4 * (3 * 1560 // 2 * dim) // 2 * 2  # 4 shards per layer, half of each leaves
    gather = (3 * 1560 // 2) * 16 * 4 * 2  # the output patches, once per call
    assert volume == all_to_alls + gather
    rows = {(r["gpus"], r["kind"]): r for r in projection()["rows"]}
    assert "not divisible by 8" in rows[(8, "ulysses")]["note"]
    nvlink, pcie = (next(k for k in rows[(2, "ulysses")] if k.startswith(p)) for p in ("NVLink", "PCIe"))
    for gpus in (2, 4):
        row = rows[(gpus, "ulysses")]
        assert 1 < row[pcie]["speedup"] < row[nvlink]["speedup"] < gpus
    assert chunk_flops(WAN_1_3B, 1560, 3, 12, 5) == pytest.approx(161.7e12, rel=1e-3)


def test_projection_only_writes_table_and_plot(tmp_path, capsys):
    assert main(["bench", "distributed", "--projection-only", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "NVLink 4 (H100, per direction) 450 GB/s" in out and "PCIe 4.0 x16 (per direction) 32 GB/s" in out
    assert json.loads((tmp_path / "distributed.json").read_text())["projected"]["rows"]
    assert (tmp_path / "distributed.png").stat().st_size > 0


@pytest.mark.slow
def test_measured_sp2_traffic_matches_the_prediction(ray_cluster, tiny_model_dir, tmp_path, capsys):
    argv = [
        "bench",
        "distributed",
        "--model",
        str(tiny_model_dir),
        "--seconds",
        "1",
        "--out-dir",
        str(tmp_path),
    ]
    assert main(argv) == 0
    measured = json.loads((tmp_path / "distributed.json").read_text())["measured"]
    sp1, sp2, split = measured["runs"]
    assert sp1["bytes_sent_per_rank"] == [0] and not sp1["decode_worker"] and split["decode_worker"]
    per_chunk = [sent / sp2["chunks"] for sent in sp2["bytes_sent_per_rank"]]
    assert per_chunk == [measured["predicted_bytes_per_rank_per_chunk"]] * 2
    assert 0.0 <= measured["decode_worker"]["decode_hidden"] <= 1.0
