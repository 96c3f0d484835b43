"""``vidgen render --jobs FILE.jsonl --parallel ray --replicas N``: jobs spread over replicas, a killed
worker replaced and its job continued, every video equal to its single-process render."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from tests.distributed.ray_network import listeners_off_loopback
from tests.tiny import assert_decoded_match, assert_frames_match
from vidgen import LongVideoPipeline
from vidgen.cli import main
from vidgen.distributed.batch import JobDefaults, JobFileError, read_jobs, run_batch
from vidgen.distributed.ray_cluster import RayParallelism
from vidgen.distributed.ray_worker import PipelineSpec
from vidgen.video import read_video

RED = "a red circle moving left on a black background"
BLUE = "a blue square moving up on a white background"


def _write_jobs(path, jobs):
    path.write_text("\n".join(json.dumps(job) for job in jobs) + "\n")
    return path


def _single_process(model, job) -> np.ndarray:
    """The job's frames from one plain pipeline (one process, no Ray), before any encoding."""
    pipe = LongVideoPipeline.from_pretrained(model)
    board = [tuple(entry) for entry in job["storyboard"]] if "storyboard" in job else [(0.0, job["prompt"])]
    return np.concatenate(
        [c.frames for c in pipe.stream(storyboard=board, seconds=job["seconds"], generator=job["seed"])]
    )


def _cli_render(model, job, folder) -> np.ndarray:
    """The job rendered by the plain ``vidgen render`` (one process, no Ray), decoded."""
    out = folder / f"reference-{job['seed']}.mp4"
    if "storyboard" in job:
        board = folder / f"board-{job['seed']}.json"
        board.write_text(json.dumps(job["storyboard"]))
        what = ["--storyboard", str(board)]
    else:
        what = ["--prompt", job["prompt"]]
    argv = [
        "render",
        "--model",
        str(model),
        *what,
        "--seconds",
        str(job["seconds"]),
        "--seed",
        str(job["seed"]),
    ]
    assert main([*argv, "--out", str(out), "--quiet"]) == 0
    return read_video(out)[0]


def test_batch_survives_a_killed_worker(ray_cluster, tiny_model_dir, tmp_path):
    jobs = [
        {"prompt": RED, "seconds": 3, "seed": 1, "out": str(tmp_path / "a.mp4")},
        {"storyboard": [[0, RED], [1, BLUE]], "seconds": 2, "seed": 2, "out": str(tmp_path / "b.mp4")},
        {"prompt": BLUE, "seconds": 1.5, "seed": 3, "out": str(tmp_path / "c.mp4")},
    ]
    jobs_file = _write_jobs(tmp_path / "jobs.jsonl", jobs)
    events, killed, network = [], {}, []

    def on_event(event):
        events.append(event)
        if event.kind == "chunk" and event.job.number == 1 and event.chunk.index == 1 and not killed:
            killed.update(pid=event.replica.pids[0], replica=event.replica.index)
            network.extend(listeners_off_loopback())  # while every worker is up
            os.kill(killed["pid"], signal.SIGKILL)

    outcomes = run_batch(
        read_jobs(jobs_file),
        PipelineSpec(str(tiny_model_dir)),
        RayParallelism(sp=1, replicas=2),
        on_event=on_event,
    )

    assert killed and network == []
    assert [o.status for o in outcomes] == ["done", "done", "done"]
    first = outcomes[0]
    assert first.restarts == 1 and len(first.replicas) == 2
    # taken again, the job continued after the chunks already recorded
    starts = [e for e in events if e.kind == "start" and e.job.number == 1]
    assert [e.recorded for e in starts][0] == 0 and starts[1].recorded >= 2
    # each chunk of each job recorded once, in order, none lost
    for number, job in enumerate(jobs, start=1):
        indices = [e.chunk.index for e in events if e.kind == "chunk" and e.job.number == number]
        assert indices == list(range(len(indices)))
        assert sum(
            len(e.chunk.frames) for e in events if e.kind == "chunk" and e.job.number == number
        ) == round(job["seconds"] * 16)
    assert {e.replica.index for e in events if e.kind == "start"} == {0, 1}  # both replicas worked
    ends = [e.job.number for e in events if e.kind == "end"]
    assert sorted(ends) == [1, 2, 3]
    for number, job in enumerate(jobs, start=1):
        made = np.concatenate(
            [e.chunk.frames for e in events if e.kind == "chunk" and e.job.number == number]
        )
        expected = _single_process(tiny_model_dir, job)
        assert_frames_match(made, expected)
        assert_decoded_match(read_video(job["out"])[0], _cli_render(tiny_model_dir, job, tmp_path))
        assert not os.path.exists(job["out"] + ".parts")


@pytest.mark.slow
def test_batch_cli_and_resume_skips_finished_videos(ray_cluster, tiny_model_dir, tmp_path, capsys):
    jobs = [
        {"prompt": RED, "seconds": 1, "seed": 4, "out": str(tmp_path / "x.mp4")},
        {"prompt": BLUE, "seconds": 1, "seed": 5, "out": str(tmp_path / "y.mp4")},
    ]
    jobs_file = _write_jobs(tmp_path / "jobs.jsonl", jobs)
    argv = ["render", "--jobs", str(jobs_file), "--model", str(tiny_model_dir), "--parallel", "ray"]
    assert main([*argv, "--replicas", "2", "--quiet"]) == 0
    assert all(os.path.isfile(j["out"]) for j in jobs)
    before = [os.path.getmtime(j["out"]) for j in jobs]
    assert main([*argv, "--resume"]) == 0
    assert "0 done, 2 already there, 0 failed" in capsys.readouterr().err
    assert [os.path.getmtime(j["out"]) for j in jobs] == before


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"prompt": "p", "out": "a.mp4", "colour": 1}, "unknown key 'colour'"),
        (
            {"prompt": "p", "storyboard": [[0, "p"]], "out": "a.mp4"},
            'exactly one of "prompt" or "storyboard"',
        ),
        ({"prompt": "p", "out": "a.avi"}, '"out" must be an .mp4 path'),
        ({"prompt": "p", "out": "a.mp4", "seconds": 0}, '"seconds" must be a positive number'),
        ('{"prompt": "p", "out": "a.mp4", "seconds": NaN}', "NaN is not a number JSON allows"),
        ({"prompt": "p", "out": "a.mp4", "seconds": True}, '"seconds" must be a number, got bool'),
        ({"prompt": "p", "out": "a.mp4", "seconds": "3"}, '"seconds" must be a number, got str'),
        ({"prompt": "p", "out": "a.mp4", "steps": 2.5}, '"steps" must be an integer'),
        ({"prompt": "p", "out": "a.mp4", "seed": 2**70}, '"seed" must be at most'),
        ('{"prompt": "p", "out": "a.mp4", "guidance": 1e400}', '"guidance" must be a finite number'),
        ({"prompt": 3, "out": "a.mp4"}, '"prompt" must be a string'),
        (
            {"storyboard": [[0, "p"], [False, "q"]], "out": "a.mp4"},
            "scene 1 start must be a number, got bool",
        ),
        ({"prompt": "p", "out": "a.mp4", "set": ["generation.shift=nan"]}, "must be a finite number"),
        ("[" * 100 + "]" * 100, "nested deeper than 16 levels"),
        ({"prompt": "p", "out": "a.mp4", "set": ["model.vae=wan"]}, "not 'model.vae'"),
        ({"prompt": "p", "out": "a.mp4", "image": "missing.png"}, "no such image file: missing.png"),
        ({"prompt": "p", "out": "a.mp4", "image": "x.png", "continue": "y.mp4"}, '"image" or "continue"'),
    ],
)
def test_job_file_errors_name_the_line(tmp_path, line, message):
    """A bad line is refused at parse time, naming the line, before any job runs (``line``: a
    job, or the raw text of a line JSON cannot write)."""
    jobs_file = tmp_path / "jobs.jsonl"
    ok = json.dumps({"prompt": "ok", "out": str(tmp_path / "ok.mp4")})
    jobs_file.write_text(ok + "\n" + (line if isinstance(line, str) else json.dumps(line)) + "\n")
    with pytest.raises(JobFileError, match="jobs.jsonl:2: ") as err:
        read_jobs(jobs_file, JobDefaults())
    assert message in str(err.value)


def test_every_bad_line_is_named_at_once(tmp_path):
    """A file with several bad lines is refused in one line naming each of them, so one round of
    fixes makes it run; past 20, the rest are counted."""
    jobs_file = tmp_path / "jobs.jsonl"
    lines = [
        json.dumps({"prompt": "ok", "out": str(tmp_path / "ok.mp4")}),
        json.dumps({"prompt": "p", "out": "a.mp4", "steps": 2.5}),
        "not json",
        json.dumps({"prompt": 3, "out": "b.mp4"}),
    ]
    jobs_file.write_text("\n".join(lines) + "\n")
    with pytest.raises(JobFileError) as err:
        read_jobs(jobs_file, JobDefaults())
    message = str(err.value)
    assert message.startswith("3 bad lines: ") and "\n" not in message
    for number, what in (
        (2, '"steps" must be an integer'),
        (3, "not JSON"),
        (4, '"prompt" must be a string'),
    ):
        assert f"jobs.jsonl:{number}: " in message and what in message
    jobs_file.write_text("\n".join(["not json"] * 25) + "\n")
    with pytest.raises(JobFileError, match=r"^25 bad lines: .*; and 5 more bad lines$"):
        read_jobs(jobs_file, JobDefaults())


def test_a_layout_that_cannot_be_placed_leaves_nothing_behind(tmp_path, monkeypatch):
    """``--replicas 64`` on a small cluster exits 2: no ``.parts`` nor ``request.json`` may stay."""
    from vidgen.distributed import batch
    from vidgen.distributed.ray_cluster import DegreeError

    def cannot_place(layout, **kw):
        raise DegreeError(f"{layout.world} workers do not fit")

    monkeypatch.setattr(batch, "place_workers", cannot_place)
    jobs_file = _write_jobs(tmp_path / "jobs.jsonl", [{"prompt": "p", "out": str(tmp_path / "a.mp4")}])
    with pytest.raises(DegreeError, match="64 workers do not fit"):
        run_batch(read_jobs(jobs_file), PipelineSpec("unused"), RayParallelism(sp=1, replicas=64))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.jsonl"]


def test_duplicate_outputs_and_missing_ray_are_refused(tmp_path, capsys):
    jobs_file = _write_jobs(tmp_path / "jobs.jsonl", [{"prompt": "p", "out": "same.mp4"}] * 2)
    with pytest.raises(JobFileError, match="also line 1's output"):
        read_jobs(jobs_file, JobDefaults())
    assert main(["render", "--jobs", str(jobs_file)]) == 2
    assert "--jobs runs on Ray: add --parallel ray" in capsys.readouterr().err


def test_continuation_job_holds_the_clip_then_its_single_process_continuation(
    ray_cluster, tiny_model_dir, tmp_path
):
    from vidgen.video import write_mp4

    clip = tmp_path / "clip.mp4"
    write_mp4(clip, (np.random.default_rng(3).random((9, 64, 64, 3)) * 255).astype(np.uint8), fps=16)
    job = {"prompt": RED, "seconds": 1, "seed": 7, "out": str(tmp_path / "more.mp4"), "continue": str(clip)}
    jobs_file = _write_jobs(tmp_path / "jobs.jsonl", [job])
    assert (
        main(
            [
                "render",
                "--jobs",
                str(jobs_file),
                "--model",
                str(tiny_model_dir),
                "--parallel",
                "ray",
                "--quiet",
            ]
        )
        == 0
    )
    reference = tmp_path / "reference.mp4"
    assert main(["render", "--model", str(tiny_model_dir), RED, "--continue", str(clip), "--seconds", "1",
                 "--seed", "7", "--out", str(reference), "--quiet"]) == 0  # fmt: skip
    made = read_video(job["out"])[0]
    assert len(made) == 9 + 16  # the clip, then a second
    assert_decoded_match(made, read_video(reference)[0])
