"""The command line answers argument mistakes, ``--version`` and ``--help`` before importing the
stack: the process never imports torch for them (the time this saves is in the README)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Runs the CLI in a fresh interpreter and reports, after its exit status, whether torch was imported.
_PROBE = """
import sys
from vidgen.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exit:
    status = exit.code
print("torch imported:", "torch" in sys.modules, file=sys.stderr)
print("ray imported:", "ray" in sys.modules, file=sys.stderr)
sys.exit(status)
"""


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["render", "--seconds", "-1", "x"], "--seconds must be a positive number, got -1"),
        (["render", "--steps", "0", "x"], "--steps must be a positive integer, got 0"),
        (["render", "--height", "-64", "x"], "--height must be a positive integer, got -64"),
        (["render", "--upscale", "0", "x"], "--upscale must be a positive integer, got 0"),
        (["render", "--upscale", "40", "x"], "--upscale enlarges up to 16 times"),
        (["render", "--parallel", "ray", "--sp", "0", "x"], "--sp must be a positive integer, got 0"),
        (["render", "--seconds", "2"], "say what to render"),
        (["render", "--seconds", "abc", "x"], "invalid float value: 'abc'"),
        (["render", "--sp-kind", "tree", "x"], "invalid choice: 'tree'"),
        (["render", "--set", "generation.shift=nan", "x"], "--set generation.shift: must be a finite number"),
        (["render", "--set", "generation.nope=1", "x"], "generation: unknown key 'nope'"),
        (["render", "--set", "nope.x=1", "x"], "override 'nope.x' must be 'table.key'"),
        (
            ["serve", "--backend", "local", "--sp", "2"],
            "--sp 2 applies to --backend ray (the local backend is one process)",
        ),
        (["serve", "--sp-kind", "ring"], "--sp-kind ring applies to --backend ray"),
        (["serve", "--backend", "ray", "--sp", "0"], "--sp must be a positive integer, got 0"),
        (["serve", "--backend", "ray", "--sp-kind", "tree"], "invalid choice: 'tree'"),
        # vidgen serve: every option is checked before the model loads (issue 13)
        (["serve", "--file-ttl", "nan"], "--file-ttl must be a finite number, got nan"),
        (["serve", "--file-ttl", "0"], "--file-ttl must be at least 1, got 0"),
        (["serve", "--port", "99999"], "--port must be at most 65535, got 99999"),
        (["serve", "--port", "0"], "--port must be at least 1, got 0"),
        (["serve", "--host", "no such host"], "--host must be an address such as 127.0.0.1"),
        (["serve", "--host", "256.0.0.1"], "--host 256.0.0.1: not an address of this machine"),
        (["serve", "--concurrency", "0"], "--concurrency must be at least 1, got 0"),
        (["serve", "--streams", "0"], "--streams must be at least 1, got 0"),
        (["serve", "--batch-sessions", "0"], "--batch-sessions must be at least 1, got 0"),
        (["serve", "--history-mb", "nan"], "--history-mb must be a finite number, got nan"),
        (["serve", "--history-mb", "-1"], "--history-mb must be at least 0, got -1"),
        (["serve", "--queue-size", "-2"], "--queue-size must be at least 1, got -2"),
        (["serve", "--segment-seconds", "inf"], "--segment-seconds must be a finite number, got inf"),
        (["serve", "--max-lead", "-inf"], "--max-lead must be a finite number, got -inf"),
        (["serve", "--upscale", "17"], "--upscale must be at most 16, got 17"),
        (["serve", "--max-upload-mb", "nan"], "--max-upload-mb must be a finite number, got nan"),
        (["serve", "--max-side", "0"], "--max-side must be at least 1, got 0"),
        (["serve", "--max-steps", "-1"], "--max-steps must be at least 1, got -1"),
        (["serve", "--max-session-seconds", "-5"], "--max-session-seconds must be at least 0, got -5"),
    ],
)
def test_argument_errors_come_before_the_heavy_imports(args, message):
    result = _cli(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "torch imported: False" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_refuses_a_degree_the_model_cannot_split_before_ray_starts():
    """The default model has 3 attention heads: Ulysses cannot split them over 2 ranks. The one
    line says so and what to change, before Ray is imported (no replica was started)."""
    result = _cli("serve", "--backend", "ray", "--sp", "2", "--sp-kind", "ulysses")
    assert result.returncode == 2
    said = [line for line in result.stderr.splitlines() if line.startswith("vidgen serve:")]
    assert said == [
        "vidgen serve: error: --sp 2: Ulysses sequence parallelism splits the 3 attention heads across "
        "sp=2 ranks, but 3 is not divisible by 2: use sp in (1, 3), or ring attention "
        "(--sp-kind ring or auto; runtime.sp_kind)"
    ]
    assert "ray imported: False" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_refuses_a_port_in_use_before_loading_the_model():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _cli("serve", "--port", str(port))
    assert result.returncode == 2, result.stderr
    assert f"vidgen serve: error: cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    # one line from vidgen; the rest is the probe's ("torch imported: ...", "ray imported: ...")
    assert [line for line in result.stderr.splitlines() if not line.endswith("imported: False")] == [
        f"vidgen serve: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]
    assert "torch imported: False" in result.stderr


def test_version_and_help_show_what_a_new_user_needs():
    result = _cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == "vidgen 0.1.0"
    assert "torch imported: False" in result.stderr

    helps = _cli("render", "--help").stdout
    flat = " ".join(helps.split())
    assert "sampler steps per chunk (default: the model's; 4)" in flat
    assert "classifier-free guidance scale, 1: off (default: the model's; 1)" in flat
    assert "frame height in pixels (default: the model's; 64)" in flat
    assert "frame width in pixels (default: the model's; 64)" in flat
    assert "--sp-kind {auto,ulysses,ring}" in flat and "--upscale N" in flat
    serve = " ".join(_cli("serve", "--help").stdout.split())
    assert "--port PORT port to listen on (default 7860)" in serve


def test_info_does_not_import_the_pipeline_stack():
    probe = "import sys; from vidgen.cli import main; main(['info']); print(sorted(m for m in sys.modules if m.split('.')[0] in ('diffusers', 'transformers', 'vidgen')))"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "default model:" in result.stdout
    loaded = result.stdout.strip().splitlines()[-1]
    assert "diffusers" not in loaded and "'transformers" not in loaded and "vidgen.pipelines" not in loaded
