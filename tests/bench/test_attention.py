"""The attention benchmark on tiny sizes: its options, table, ratios, JSON and plot."""

from __future__ import annotations

import argparse
import json

import pytest

from vidgen.bench import attention as benchmark
from vidgen.cli import bench


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vidgen")
    bench.add_parser(parser.add_subparsers(dest="command"), "bench")
    return parser.parse_args(["bench", "attention", *argv])


def test_cli_options_and_defaults():
    args = parse([])
    assert args.seq_lens == [4096, 8192, 16384, 32768, 65536]
    assert (args.window_tokens, args.chunk_tokens, args.max_dense_len) == (512, 256, 16384)
    args = parse(["--seq-lens", "256,512", "--backends", "sdpa", "--repeats", "1"])
    assert args.seq_lens == [256, 512] and args.backends == "sdpa" and args.repeats == 1
    with pytest.raises(SystemExit):
        parse(["--seq-lens", "256,abc"])


def test_benchmark_writes_table_json_and_plot(tmp_path, capsys):
    args = parse(
        ["--seq-lens", "512,256,1024", "--window-tokens", "128", "--chunk-tokens", "64", "--heads", "1",
         "--head-dim", "8", "--repeats", "1", "--max-dense-len", "512", "--backends", "sdpa",
         "--device", "cpu", "--out-dir", str(tmp_path)]
    )  # fmt: skip
    assert benchmark.main(args) == 0
    out = capsys.readouterr().out
    assert "window sdpa" in out and "extrapolated" in out and str(tmp_path / "attention.png") in out
    result = json.loads((tmp_path / "attention.json").read_text())
    rows = {(r["seq_len"], r["variant"]): r for r in result["rows"]}
    assert set(rows) == {(n, v) for n in (256, 512, 1024) for v in ("dense sdpa", "window sdpa")}
    assert not rows[512, "dense sdpa"]["extrapolated"]
    dense_1k = rows[1024, "dense sdpa"]
    assert dense_1k["extrapolated"] and dense_1k["ms"] == pytest.approx(4 * rows[512, "dense sdpa"]["ms"])
    window = rows[1024, "window sdpa"]
    assert window["ms_per_1k_tokens"] == pytest.approx(window["ms"] / 1.024)
    assert window["speedup_vs_dense"] == pytest.approx(dense_1k["ms"] / window["ms"])
    ratio = result["ratios"]["sdpa"]
    assert ratio["per_token_lengths"] == [256, 1024]
    assert ratio["per_token_cost_ratio"] == pytest.approx(
        window["ms_per_1k_tokens"] / rows[256, "window sdpa"]["ms_per_1k_tokens"]
    )
    assert ratio["dense_over_window_at_16k"] is None  # 16k was not in --seq-lens
    assert (tmp_path / "attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_window_is_a_one_line_error(tmp_path, capsys):
    args = parse(["--window-tokens", "100", "--chunk-tokens", "64", "--out-dir", str(tmp_path)])
    assert benchmark.main(args) == 2
    assert "must be a multiple of --chunk-tokens 64" in capsys.readouterr().out


def test_unusable_backend_is_refused(tmp_path, capsys):
    args = parse(["--backends", "xformers", "--seq-lens", "256", "--out-dir", str(tmp_path)])
    if not benchmark.get_backend("xformers").unusable_reason():
        pytest.skip("xformers is usable here")
    assert benchmark.main(args) == 2
    assert "xformers is not installed" in capsys.readouterr().out


def test_radial_key_layout_is_the_kv_cache_order():
    from vidgen.bench.attention_chunk import cache_layout
    from vidgen.models import KVCache

    cache = KVCache(num_layers=1, batch_size=1, num_heads=1, head_dim=2, frame_tokens=1, sink_frames=3,
                    window_frames=9)  # fmt: skip
    for chunks_done in range(9):
        assert cache_layout(3, 9, 3, chunks_done) == cache.cached_frames + [
            3 * chunks_done + i for i in range(3)
        ]
        cache.commit(3 * chunks_done, 3)


def test_radial_benchmark_writes_dense_and_radial_rows(tmp_path, capsys):
    args = parse(
        ["--radial", "--frame-size", "6x5", "--heads", "1", "--head-dim", "8", "--repeats", "1",
         "--backends", "sdpa", "--device", "cpu", "--out-dir", str(tmp_path)]
    )  # fmt: skip
    assert benchmark.main(args) == 0
    assert "dense / radial (sdpa)" in capsys.readouterr().out
    result = json.loads((tmp_path / "attention-radial.json").read_text())
    c = result["config"]
    assert (c["q_len"], c["kv_len"]) == (3 * 30, 15 * 30)
    assert c["key_frames"][-3:] == sorted(c["key_frames"])[-3:] and c["key_frames"] != sorted(c["key_frames"])
    dense, radial = result["rows"]
    assert dense["variant"] == "dense sdpa" and radial["variant"] == "radial sdpa"
    assert radial["speedup_vs_dense"] == pytest.approx(dense["ms"] / radial["ms"])
    assert 0 < c["density"] < 1 and radial["rel_error"] > 0  # keys are dropped, so the output moves
