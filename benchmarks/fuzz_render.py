"""Feed ``vidgen render`` bad inputs and count those that end cleanly.

Clean: exit status 2, no traceback, at most three lines on stderr (argparse adds its usage line),
and nothing new left in the folder (no ``.parts``, no MP4). Each case runs in a fresh folder with
``--seconds 1`` (unless the case sets it) and a time limit; a case past the limit is not clean.

    python benchmarks/fuzz_render.py [--timeout 40] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def _deep_json(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def cases() -> list[tuple[str, list, dict[str, bytes]]]:
    """(name, extra argv, files to create) per case; argv items may be bytes (undecodable)."""
    p = ["a red ball bouncing"]
    c: list[tuple[str, list, dict[str, bytes]]] = []
    for v in ("nan", "inf", "-inf", "1e308", "-1", "0", "1e300", "NaN"):
        c.append((f"seconds {v}", [*p, "--seconds", v], {}))
    for v in ("99999999999999999999999", "-1", str(2**64), str(2**63)):
        c.append((f"seed {v}", [*p, "--seed", v], {}))
    for v in ("-3", "0", "100000", "2147483648"):
        c.append((f"steps {v}", [*p, "--steps", v], {}))
    for v in ("nan", "inf", "-inf", "0", "1e308"):
        c.append((f"guidance {v}", [*p, "--guidance", v], {}))
    for s in (
        "generation.shift=nan",
        "generation.shift=inf",
        "generation.guidance_scale=nan",
        "drift.anchor_strength=nan",
        "drift.anchor_tolerance=inf",
        "generation.fps=0",
        "generation.height=-64",
        "generation.num_inference_steps=100000",
        "runtime.threads=-1",
        "generation.nope=1",
        "generation.chunk_frames=0",
        "generation.addnoise_condition=nan",
        "noequals",
    ):
        c.append((f"set {s}", [*p, "--set", s], {}))
    c.append(("max_seconds inf", [*p, "--set", "generation.max_seconds=inf", "--seconds", "1e300"], {}))
    for flags in (
        ["--height", "0"],
        ["--width", "0"],
        ["--height", "63"],
        ["--height", "4096", "--width", "4096"],
        ["--height", "100000"],
        ["--fps", "0"],
        ["--fps", "-1"],
        ["--fps", "10000000", "--seconds", "3600"],
        ["--sp", "0"],
        ["--upscale", "0"],
        ["--upscale", "17"],
    ):
        c.append((" ".join(flags), [*p, *flags], {}))
    c.append(("out existing dir", [*p, "--out", "d.mp4"], {"d.mp4/keep": b""}))
    c.append(("out no suffix", [*p, "--out", "video"], {}))
    c.append(("out missing folder", [*p, "--out", "no/such/dir/v.mp4"], {}))
    c.append(("prompt non-utf8", [b"caf\xe9 \xff\xfe"], {}))
    c.append(("prompt empty", [""], {}))
    c.append(("prompt blank", ["   "], {}))
    board = {
        "binary.json": bytes(range(256)) * 4,
        "latin1.toml": '[[scene]]\nstart = 0\nprompt = "caf\xe9"\n'.encode("latin-1"),
        "deep.json": _deep_json(200_000),
        "nan.json": b'[[0, "a ball"], [NaN, "a cube"]]',
        "false.json": b'[[false, "a ball"]]',
        "empty.json": b"[]",
        "decreasing.json": b'[[0, "a ball"], [2, "a cube"], [1, "a star"]]',
        "late.json": b'[[1, "a ball"]]',
        "huge.json": b'[[0, "a ball"], [1e400, "a cube"]]',
        "stringtime.json": b'[["0", "a ball"]]',
        "object.json": b'{"nothing": 1}',
        "big.json": b'[[0, "a ball"], [1e308, "a cube"]]',
        "infinity.json": b'[[0, "a ball"], [Infinity, "a cube"]]',
        "emptyprompt.json": b'[[0, ""]]',
    }
    for name, data in board.items():
        c.append((f"storyboard {name}", ["--storyboard", name], {name: data}))
    c.append(("storyboard missing", ["--storyboard", "nope.json"], {}))
    configs = {
        "binary.toml": bytes(range(256)) * 4,
        "latin1.toml": '[generation]\nnegative_prompt = "caf\xe9"\n'.encode("latin-1"),
        "nan.toml": b"[generation]\nshift = nan\n",
        "unknown.toml": b"[generation]\nnope = 1\n",
        "inf.toml": b"[generation]\nmax_seconds = inf\n",
    }
    for name, data in configs.items():
        c.append((f"config {name}", [*p, "--config", name], {name: data}))
    c.append(("config missing", [*p, "--config", "nope.toml"], {}))
    c.append(
        (
            "model vidgen.toml binary",
            [*p, "--model", "m"],
            {"m/vidgen.toml": bytes(range(256)), "m/model_index.json": b"{}"},
        )
    )
    c.append(("image missing", [*p, "--image", "nope.png"], {}))
    c.append(("image not an image", [*p, "--image", "x.png"], {"x.png": b"not a png"}))
    c.append(
        ("resume truncated request", [*p, "--resume", "--out", "v.mp4"], {"v.mp4.parts/request.json": b"{"})
    )
    c.append(
        (
            "resume other seed",
            [*p, "--resume", "--seed", "7", "--out", "v.mp4"],
            {"v.mp4.parts/request.json": b"SAVED"},
        )
    )
    return c


def saved_request(folder: Path) -> bytes:
    """The request.json ``render a red ball bouncing --seconds 1 --out v.mp4`` writes, seed 3."""
    from vidgen.cli import build_parser
    from vidgen.cli.render import saved_record

    args = build_parser().parse_args(["render", "--prompt", "a red ball bouncing", "--seconds", "1"])
    return json.dumps(saved_record(args, 3)).encode()


def run_case(name: str, argv: list, files: dict[str, bytes], timeout: float) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for rel, data in files.items():
            path = folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(saved_request(folder) if data == b"SAVED" else data)
        before = {p for p in folder.rglob("*")}
        full = [os.fsencode(sys.executable), b"-m", b"vidgen", b"render", b"--quiet"]
        full += [a if isinstance(a, bytes) else os.fsencode(a) for a in argv]
        if b"--seconds" not in full:
            full += [b"--seconds", b"1"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        try:
            proc = subprocess.run(full, cwd=folder, capture_output=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return False, "timed out"
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        left = sorted(str(p.relative_to(folder)) for p in set(folder.rglob("*")) - before)
        last = err[-1] if err else ""
        clean = proc.returncode == 2 and "Traceback" not in proc.stderr.decode(errors="replace")
        clean = clean and 0 < len(err) <= 3 and not left
        return clean, f"rc={proc.returncode} left={left} {last[:150]}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=40)
    parser.add_argument("--only", default="")
    opts = parser.parse_args()
    todo = [c for c in cases() if opts.only in c[0]]
    clean = 0
    for name, argv, files in todo:
        ok, detail = run_case(name, argv, files, opts.timeout)
        clean += ok
        print(f"{'clean' if ok else 'DIRTY'}  {name}: {detail}", flush=True)
    print(f"tried {len(todo)}, clean {clean}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
