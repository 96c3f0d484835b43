"""The server's folder: nothing outside it is touched, old runs are swept, the folder goes at exit."""

import os
import time

import pytest

from vidgen.ui.files import ServerFiles, is_inside


@pytest.fixture
def files(tmp_path):
    server = ServerFiles.create(ttl_seconds=60, parent=tmp_path)
    yield server
    server.cleanup()


def test_is_inside_follows_dots_and_links(tmp_path):
    root = tmp_path / "root"
    (root / "runs").mkdir(parents=True)
    outside = tmp_path / "secret.txt"
    outside.write_text("no")
    assert is_inside(root / "runs" / "a.ts", root)
    assert not is_inside(root / "runs" / ".." / ".." / "secret.txt", root)
    assert not is_inside("/etc/passwd", root)
    assert not is_inside(tmp_path / "root-sibling", root)  # a shared prefix is not inside
    (root / "runs" / "link").symlink_to(outside)
    assert not is_inside(root / "runs" / "link", root)


def test_runs_live_inside_and_removal_refuses_anything_else(files, tmp_path):
    run = files.new_run()
    assert run.parent == files.runs_dir and files.contains(run)
    assert files.gradio_dir.is_dir() and files.contains(files.gradio_dir)
    victim = tmp_path / "keep.txt"
    victim.write_text("keep")
    with pytest.raises(ValueError, match="not inside"):
        files._remove(victim)
    with pytest.raises(ValueError, match="not inside"):
        files._remove(files.root)
    assert victim.read_text() == "keep"


def test_sweep_removes_old_runs_but_not_running_ones(files, tmp_path):
    old, running, fresh = files.new_run(), files.new_run(), files.new_run()
    for run in (old, running, fresh):
        (run / "video.mp4").write_bytes(b"x")
    files.release(old)
    files.release(fresh)
    cached = files.gradio_dir / "abc"
    cached.mkdir()
    (cached / "video.mp4").write_bytes(b"x")
    # a symlink in a run pointing outside is removed as a link, its target is kept
    target = tmp_path / "outside.txt"
    target.write_text("keep")
    (old / "link").symlink_to(target)
    past = time.time() - 3600
    for path in (old, old / "video.mp4", running, running / "video.mp4", cached, cached / "video.mp4"):
        os.utime(path, (past, past))
    os.utime(old / "link", (past, past), follow_symlinks=False)

    removed = files.sweep()
    assert set(removed) == {old, cached}
    assert not old.exists() and not cached.exists()
    assert running.is_dir() and fresh.is_dir() and target.read_text() == "keep"
    files.release(running)  # its folder ages from the end of the run
    assert files.sweep() == []
    assert set(files.sweep(now=time.time() + 61)) == {running, fresh}


def test_release_with_delete_and_cleanup(files):
    run = files.new_run()
    (run / "segment_00000.ts").write_bytes(b"x")
    files.release(run, delete=True)
    assert not run.exists()
    files.start_sweeping(every_seconds=0.05)
    root = files.root
    files.cleanup()
    assert not root.exists()


def test_time_to_live_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="time to live"):
        ServerFiles(tmp_path, ttl_seconds=0)
