"""``vidgen bench attention``: dense attention vs a sliding window as the sequence grows.

For each sequence length it times full (dense) SDPA and the ``sliding_window`` pattern on every
chosen backend, prints a table (ms per call, ms per 1k tokens, speed-up over dense), and
reports two ratios measured in this one run:

* windowed cost per token at the longest length / at the shortest (4k by default):
  linear scaling means ~1, the target is <= 1.5;
* dense time / windowed time at 16k tokens: the target is >= 10.

Dense attention beyond ``--max-dense-len`` is not run (64k on two CPU cores takes minutes) but
extrapolated quadratically from the longest measured length, and marked so. The table goes to
``attention.json`` and a plot to ``attention.png`` under ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vidgen.attention.dispatch import dispatch_attention
from vidgen.attention.patterns import AttentionPattern
from vidgen.attention.registry import available_backends, get_backend

PER_TOKEN_TARGET = 1.5
SPEEDUP_TARGET = 10.0
SPEEDUP_LEN = 16384


def _timed(fn: Callable[[], torch.Tensor], device: torch.device, repeats: int) -> tuple[float, float]:
    """(first call ms, median ms of ``repeats`` later calls); the first includes compiling and mask building."""

    def once() -> float:
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) * 1000

    first = once()
    return first, statistics.median(once() for _ in range(max(repeats, 1)))


def _window_pattern(args: argparse.Namespace) -> AttentionPattern:
    if args.window_tokens % args.chunk_tokens:
        raise ValueError(
            f"--window-tokens {args.window_tokens} must be a multiple of --chunk-tokens {args.chunk_tokens}"
        )
    # one chunk per "frame": the benchmark is about token counts, not video geometry
    return AttentionPattern.sliding_window(
        frame_tokens=args.chunk_tokens, chunk_frames=1, window_frames=args.window_tokens // args.chunk_tokens
    )


def _backends(args: argparse.Namespace, device: torch.device) -> list[str]:
    if args.backends:
        names = [n.strip() for n in args.backends.split(",") if n.strip()]
        for name in names:
            reason = get_backend(name).unusable_reason()
            if reason:
                raise ValueError(f"backend {name!r} is unusable here: {reason}")
        return names
    return [n for n in available_backends() if device.type in get_backend(n).devices]


def _measure_length(
    args: argparse.Namespace,
    seq_len: int,
    pattern: AttentionPattern,
    backends: list[str],
    device: torch.device,
) -> tuple[dict | None, list[dict]]:
    """Dense (if within --max-dense-len) and windowed timings at one sequence length."""
    gen = torch.Generator(device="cpu").manual_seed(seq_len)
    q, k, v = (  # (B, S, H, D)
        torch.randn(args.batch, seq_len, args.heads, args.head_dim, generator=gen).to(device)
        for _ in range(3)
    )
    dense = None
    if seq_len <= args.max_dense_len:
        first, ms = _timed(lambda: dispatch_attention(q, k, v, backend="sdpa"), device, args.repeats)
        dense = {"seq_len": seq_len, "variant": "dense sdpa", "backend": "sdpa", "ms": ms, "first_ms": first}
    windowed = []
    for name in backends:
        first, ms = _timed(
            lambda name=name: dispatch_attention(q, k, v, pattern=pattern, backend=name), device, args.repeats
        )
        windowed.append(
            {"seq_len": seq_len, "variant": f"window {name}", "backend": name, "ms": ms, "first_ms": first}
        )
    return dense, windowed


def run_benchmark(args: argparse.Namespace) -> dict:
    """Measure every (length, variant) and return the table and ratios as a JSON-able dict."""
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    pattern = _window_pattern(args)
    backends = _backends(args, device)
    rows: list[dict] = []
    last_dense: dict | None = None
    with torch.inference_mode():
        for seq_len in sorted(args.seq_lens):
            dense, windowed = _measure_length(args, seq_len, pattern, backends, device)
            if dense is not None:
                last_dense = dense
                rows.append({**dense, "extrapolated": False})
            elif last_dense is not None:  # quadratic cost: scale the longest measured dense time
                ms = last_dense["ms"] * (seq_len / last_dense["seq_len"]) ** 2
                rows.append(
                    {**last_dense, "seq_len": seq_len, "ms": ms, "first_ms": None, "extrapolated": True}
                )
            rows.extend({**row, "extrapolated": False} for row in windowed)
            print(f"  measured {seq_len} tokens", flush=True)
    for row in rows:
        dense_ms = next(
            (r["ms"] for r in rows if r["seq_len"] == row["seq_len"] and r["variant"] == "dense sdpa"), None
        )
        row["ms_per_1k_tokens"] = row["ms"] / (row["seq_len"] / 1000)
        row["speedup_vs_dense"] = dense_ms / row["ms"] if dense_ms else None
    return {
        "config": {
            "batch": args.batch,
            "heads": args.heads,
            "head_dim": args.head_dim,
            "dtype": "float32",
            "device": str(device),
            "chunk_tokens": args.chunk_tokens,
            "window_tokens": args.window_tokens,
            "repeats": args.repeats,
            "max_dense_len": args.max_dense_len,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(),
        },
        "rows": rows,
        "ratios": _ratios(rows, backends),
    }


def _ratios(rows: list[dict], backends: list[str]) -> dict:
    lengths = sorted({r["seq_len"] for r in rows})
    shortest, longest = lengths[0], lengths[-1]
    ratios = {}
    for name in backends:
        by_len = {r["seq_len"]: r for r in rows if r["variant"] == f"window {name}"}
        per_token = by_len[longest]["ms_per_1k_tokens"] / by_len[shortest]["ms_per_1k_tokens"]
        at = by_len.get(SPEEDUP_LEN)
        dense_at = next(
            (r for r in rows if r["seq_len"] == SPEEDUP_LEN and r["variant"] == "dense sdpa"), None
        )
        ratios[name] = {
            "per_token_cost_ratio": per_token,
            "per_token_lengths": [shortest, longest],
            "per_token_target": PER_TOKEN_TARGET,
            "per_token_ok": per_token <= PER_TOKEN_TARGET,
            "dense_over_window_at_16k": at["speedup_vs_dense"] if at and dense_at else None,
            "dense_at_16k_extrapolated": dense_at["extrapolated"] if dense_at else None,
            "speedup_target": SPEEDUP_TARGET,
            "speedup_ok": (at["speedup_vs_dense"] >= SPEEDUP_TARGET) if at and dense_at else None,
        }
    return ratios


def format_table(result: dict) -> str:
    """The human-readable table and ratio lines."""
    c = result["config"]
    lines = [
        f"attention: B={c['batch']} H={c['heads']} D={c['head_dim']} {c['dtype']} on {c['device']} "
        f"({c['threads']} threads), sliding window = own chunk of {c['chunk_tokens']} + {c['window_tokens']} "
        f"tokens before it; median of {c['repeats']}",
        f"{'tokens':>7}  {'variant':<16} {'ms/call':>10} {'ms/1k tok':>10} {'vs dense':>9}  {'first call ms':>13}",
    ]
    for r in result["rows"]:
        mark = " *" if r["extrapolated"] else ""
        speedup = f"{r['speedup_vs_dense']:.1f}x" if r["speedup_vs_dense"] else "-"
        first = f"{r['first_ms']:.0f}" if r["first_ms"] is not None else "-"
        lines.append(
            f"{r['seq_len']:>7}  {r['variant']:<16} {r['ms']:>10.1f} {r['ms_per_1k_tokens']:>10.2f} "
            f"{speedup:>9}  {first:>13}{mark}"
        )
    if any(r["extrapolated"] for r in result["rows"]):
        lines.append(f"  * dense not run beyond {c['max_dense_len']} tokens: extrapolated as length^2")
    for name, ratio in result["ratios"].items():
        short, long_ = ratio["per_token_lengths"]
        verdict = "ok" if ratio["per_token_ok"] else "MISSED"
        lines.append(
            f"{name}: windowed cost per token at {long_} / at {short} = {ratio['per_token_cost_ratio']:.2f} "
            f"(target <= {ratio['per_token_target']}: {verdict})"
        )
        if ratio["dense_over_window_at_16k"] is None:
            lines.append(
                f"{name}: dense / windowed at {SPEEDUP_LEN}: not measured (add {SPEEDUP_LEN} to --seq-lens)"
            )
        else:
            verdict = "ok" if ratio["speedup_ok"] else "MISSED"
            note = " (dense extrapolated)" if ratio["dense_at_16k_extrapolated"] else ""
            lines.append(
                f"{name}: dense / windowed at {SPEEDUP_LEN} = {ratio['dense_over_window_at_16k']:.1f}x{note} "
                f"(target >= {ratio['speedup_target']:.0f}: {verdict})"
            )
    return "\n".join(lines)


def save_plot(result: dict, path: Path) -> None:
    """Milliseconds per 1k tokens against sequence length, one line per variant."""
    from vidgen.plotting import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant in dict.fromkeys(r["variant"] for r in result["rows"]):
        rows = [r for r in result["rows"] if r["variant"] == variant]
        measured = [r for r in rows if not r["extrapolated"]]
        ax.plot(
            [r["seq_len"] for r in measured], [r["ms_per_1k_tokens"] for r in measured], "o-", label=variant
        )
        if len(measured) < len(rows):
            tail = measured[-1:] + [r for r in rows if r["extrapolated"]]
            ax.plot([r["seq_len"] for r in tail], [r["ms_per_1k_tokens"] for r in tail], "x--", color="grey",
                    label=f"{variant} (extrapolated)")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("ms per 1k tokens")
    c = result["config"]
    ax.set_title(
        f"attention cost per token: dense vs {c['window_tokens']}-token window, "
        f"H={c['heads']} D={c['head_dim']}, {c['device']}"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _main_radial(args: argparse.Namespace) -> int:
    from vidgen.bench.attention_chunk import format_chunk_table, run_chunk_benchmark

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        result = run_chunk_benchmark(args, _backends(args, device), device)
    except ValueError as err:
        print(f"vidgen bench attention: error: {err}")
        return 2
    print(format_chunk_table(result))
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "attention-radial.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"table: {path}")
    return 0


def main(args: argparse.Namespace) -> int:
    """Run the benchmark, print the table, save JSON and PNG under ``args.out_dir``."""
    if getattr(args, "radial", False):
        return _main_radial(args)
    args.heads, args.head_dim = args.heads or 4, args.head_dim or 64
    try:
        result = run_benchmark(args)
    except ValueError as err:  # a bad option: one line, like the CLI's usage errors
        print(f"vidgen bench attention: error: {err}")
        return 2
    print(format_table(result))
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / "attention.json", out_dir / "attention.png"
    json_path.write_text(json.dumps(result, indent=2))
    save_plot(result, png_path)
    print(f"table: {json_path}\nplot:  {png_path}")
    return 0
