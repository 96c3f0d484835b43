"""The training curve: eval reports become points against training time, drawn as a PNG."""

import json

import pytest

from vidgen.cli import main
from vidgen.training.curve import add_point, curve_point

REPORT = {
    "short": {"videos": 20, "adherence_rate": 0.1, "frame_pass_rate": 0.5, "shape_right_rate": 0.6},
    "storyboards": {"videos": 10, "changes_within_1s": 0.25},
}


def test_a_point_takes_the_short_table_and_the_storyboard_changes():
    point = curve_point(REPORT, step=7000, hours=3.51234, note="lr 1.5e-4")
    assert point == {
        "step": 7000,
        "hours": 3.512,
        "videos": 20,
        "adherence_rate": 0.1,
        "frame_pass_rate": 0.5,
        "shape_right_rate": 0.6,
        "changes_within_1s": 0.25,
        "note": "lr 1.5e-4",
    }
    with pytest.raises(ValueError, match="--held-out"):
        curve_point({"long": {}}, step=1, hours=1)


def test_points_are_kept_sorted_and_a_step_is_replaced(tmp_path):
    curve = tmp_path / "curve.json"
    add_point(curve, curve_point(REPORT, 9000, 5.0))
    add_point(curve, curve_point(REPORT, 7000, 4.0))
    points = add_point(curve, {**curve_point(REPORT, 9000, 5.0), "frame_pass_rate": 0.7})
    assert [p["step"] for p in points] == [7000, 9000]
    assert points[1]["frame_pass_rate"] == 0.7
    assert json.loads(curve.read_text()) == points
    # the same step after more hours (a part trained after it) is a point of its own
    points = add_point(curve, {**curve_point(REPORT, 9000, 5.5), "frame_pass_rate": 0.75})
    assert [(p["step"], p["hours"], p["frame_pass_rate"]) for p in points][1:] == [
        (9000, 5.0, 0.7),
        (9000, 5.5, 0.75),
    ]


def test_cli_reads_the_checkpoint_progress_and_draws(tmp_path, capsys):
    run = tmp_path / "run" / "latest"
    run.mkdir(parents=True)
    (run / "state.json").write_text(json.dumps({"step": 6300, "wall_seconds": 7200.0}))
    report = tmp_path / "report.json"
    report.write_text(json.dumps(REPORT))
    curve, png = tmp_path / "curve.json", tmp_path / "curve.png"
    args = ["train", "curve", "--report", str(report), "--curve", str(curve), "--png", str(png)]
    assert main([*args, "--run-dir", str(tmp_path / "run")]) == 0
    assert json.loads(curve.read_text())[0]["step"] == 6300
    assert json.loads(curve.read_text())[0]["hours"] == 2.0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(args) == 2  # neither --run-dir nor --step/--hours
    assert "--run-dir" in capsys.readouterr().err
