"""``benchmarks/gpu/run.sh --dry-run``: the device benchmark's code path on the CPU, tiny geometry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_benchmark_dry_run_writes_every_variant(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path), OMP_NUM_THREADS="1")
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu/run.sh"), "--dry-run"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert report["config"]["dry_run"] and report["config"]["device"] == "cpu"
    variants = report["variants"]
    assert set(variants) == {"dense", "flash", "radial", "compiled", "fp8"}
    for name in ("dense", "radial"):
        v = variants[name]
        assert v["fps_video"] > 0 and v["time_to_first_frame_s"] > 0 and not v["overlapped_decode"]
    # every frame of the 2-s video (16 fps) came out of the overlapped decoder
    assert variants["radial"]["frames"] == round(report["config"]["seconds"] * 16)
    assert sum(variants["radial"]["chunk_frames"]) == variants["radial"]["frames"]  # FPS counts them
    assert len(variants["dense"]["chunk_s"]) >= report["chunk_5_vs_late"]["late_chunk"] + 3
    assert report["chunk_5_vs_late"]["late_over_5"] > 0
    for name in ("flash", "compiled", "fp8"):  # no CUDA here: skipped, with the reason
        assert variants[name]["skipped"]
    assert (tmp_path / "gpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gpu_benchmark_installs_from_carried_wheels(tmp_path):
    """The lent GPU machine's install path, as it is there: the wheels benchmarks/gpu/wheels.sh
    fetches (PyPI, reachable here and in CI) and a wheel of this tree, installed with
    ``--no-index --no-deps`` into an empty target that goes first on PYTHONPATH; then the dry run
    imports vidgen and diffusers from that target."""
    wheels, site, out = tmp_path / "whl", tmp_path / "site", tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    fetched = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu/wheels.sh"), str(wheels)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert fetched.returncode == 0, fetched.stdout[-2000:] + fetched.stderr[-2000:]
    assert [p.name.split("-")[0] for p in wheels.glob("*.whl")] == ["diffusers"]
    env.update(VIDGEN_WHEELS=str(wheels), VIDGEN_SITE=str(site), OUT=str(out))
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu/run.sh"), "--dry-run"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "no index" in done.stderr
    report = json.loads((out / "gpu.json").read_text())
    assert report["config"]["vidgen_from"] == str(site / "vidgen")
    assert (site / "diffusers").is_dir() and (site / "vidgen" / "default_model").is_dir()
