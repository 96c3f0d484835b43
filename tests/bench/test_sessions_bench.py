"""``vidgen bench sessions`` on a tiny model: every way and count is measured and reported, and the
batched sessions make exactly the frames of the sessions made in turns (the max pixel difference is
measured, and is 0 here). No speed is asserted: timings on a shared CPU are noisy."""

from __future__ import annotations

import argparse
import json

import pytest

from tests.tiny import save_tiny_pipeline
from vidgen.bench import sessions as benchmark
from vidgen.cli import bench


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vidgen")
    bench.add_parser(parser.add_subparsers(dest="command"), "bench")
    return parser.parse_args(["bench", "sessions", *argv])


def test_options_and_their_refusals():
    args = parse([])
    assert (args.sessions, args.seconds, args.lanes, args.model) == ([1, 2, 4, 8], 6.0, 0, None)
    with pytest.raises(SystemExit):
        parse(["--sessions", "0,2"])


def test_every_way_is_measured_and_batched_frames_are_the_frames_made_in_turns(tmp_path, capsys):
    model = save_tiny_pipeline(tmp_path / "pipe", **{"runtime.autocast": "off"})
    args = parse(["--model", str(model), "--sessions", "1,3", "--seconds", "1.5", "--lanes", "2",
                  "--out-dir", str(tmp_path / "out")])  # fmt: skip
    assert benchmark.main(args) == 0
    result = json.loads((tmp_path / "out" / "sessions.json").read_text())
    assert (tmp_path / "out" / "sessions.png").stat().st_size > 0
    ways = [(row["sessions"], row["way"]) for row in result["rows"]]
    assert ways == [(1, "turns"), (3, "turns"), (3, "threads"), (3, "batched")]
    for row in result["rows"]:
        assert row["max_pixel_diff"] == 0, row["way"]
        assert row["throughput"] > 0 and len(row["rtf"]) == row["sessions"] == len(row["first_chunk_s"])
        assert row["rss_mib"]["before"] > 0 and row["rss_mib"]["after"] > 0
    batched = result["rows"][-1]["batched"]
    assert batched["calls"] > batched["forwards"]  # the three sessions shared forwards
    assert result["lanes"] == 2
    out = capsys.readouterr().out
    assert "vs turns" in out and "max px diff" in out and "sessions.json" in out
