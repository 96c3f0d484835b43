"""What each refusal of issue 54's probe costs, as a user meets it: ``python -m vidgen ...`` in a
fresh process per case (``tests/cli/test_refusals.py``'s table), its wall time and its peak
resident memory (the child's own ``VmHWM``, read as it exits).

    python benchmarks/refusal_costs.py [--out refusals.json]

The issue's bar: each refusal within a second or two and under 1 GB. A fresh process pays for
Python and what the command imports before it can refuse (torch, for the cases that need the
model's config or weights): the table says which cases those are.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.cli.test_refusals import CASES, command_line, make_inputs  # noqa: E402


def run_case(argv: list[str]) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    process = subprocess.run(
        [sys.executable, "-c", CHILD, *argv], env=env, capture_output=True, text=True, timeout=300
    )
    wall = time.perf_counter() - started
    err = process.stderr.strip().splitlines()
    peak = [line for line in err if line.startswith(PEAK)]
    err = [line for line in err if not line.startswith(PEAK)]
    return {
        "exit": process.returncode,
        "seconds": wall,
        "peak_mb": int(peak[-1].split()[1]) / 1024 if peak else float("nan"),  # kB
        "lines": len(err),
        "line": err[0] if err else "",
    }


PEAK = "refusal-costs-peak-kb"
# the child reports its own peak (VmHWM belongs to the process image: a fork's ru_maxrss would
# count this benchmark's memory too)
CHILD = f"""
import atexit, sys
def peak():
    status = open("/proc/self/status").read()
    print("{PEAK}", status.split("VmHWM:")[1].split()[0], file=sys.stderr)
atexit.register(peak)
from vidgen.cli import main
sys.exit(main(sys.argv[1:]))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/bench/refusals.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        files = make_inputs(Path(scratch) / "inputs")
        for line, words in CASES:
            out = Path(scratch) / f"out{len(rows)}"
            out.mkdir()
            row = {
                "case": line.split(" ", 1)[0] + " " + line.split("--", 1)[-1][:70],
                **run_case(command_line(line, files, out)),
            }
            row["ok"] = (
                row["exit"] == 2 and row["lines"] == 1 and words in row["line"] and not list(out.iterdir())
            )
            rows.append(row)
            print(
                f"{row['seconds']:6.2f} s {row['peak_mb']:7.0f} MB  {'ok ' if row['ok'] else 'BAD'}  {row['case']}"
            )
    slowest = max(rows, key=lambda r: r["seconds"])
    largest = max(rows, key=lambda r: r["peak_mb"])
    print(
        f"{len(rows)} cases, {sum(r['ok'] for r in rows)} one line and exit 2 with nothing written; "
        f"slowest {slowest['seconds']:.2f} s ({slowest['case']}), largest {largest['peak_mb']:.0f} MB ({largest['case']})"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
