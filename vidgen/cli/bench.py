"""``vidgen bench TARGET``: benchmarks that report ratios measured in one run (tables + PNG plots).

Options are declared here so that building the parser imports no torch; each target's module
(``vidgen.bench.<target>``) is imported only when it runs and exposes ``main(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _frame_size(text: str) -> tuple[int, int]:
    try:
        h, w = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HxW in tokens, e.g. 30x52, got {text!r}") from None
    return h, w


def _add_attention_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seq-lens",
        type=_positive_ints,
        default=[4096, 8192, 16384, 32768, 65536],
        help="comma-separated sequence lengths in tokens (default: 4096,...,65536)",
    )
    parser.add_argument(
        "--window-tokens", type=int, default=512, help="history visible before a query's chunk (default: 512)"
    )
    parser.add_argument(
        "--chunk-tokens",
        type=int,
        default=256,
        help="tokens per causal chunk; divides --window-tokens (default: 256)",
    )
    parser.add_argument("--heads", type=int, default=None, help="attention heads (default: 4; --radial: 12)")
    parser.add_argument(
        "--head-dim", type=int, default=None, help="head dimension (default: 64; --radial: 128)"
    )
    parser.add_argument("--batch", type=int, default=1, help="batch size (default: 1)")
    parser.add_argument(
        "--backends", default=None, help="comma-separated backends for the window (default: all usable here)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed calls per measurement, after one warm-up"
    )
    parser.add_argument(
        "--max-dense-len",
        type=int,
        default=16384,
        help="longest sequence for dense attention; longer ones are extrapolated and marked (default: 16384)",
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    radial = parser.add_argument_group("--radial: one chunk over a full KV cache, dense vs radial")
    radial.add_argument("--radial", action="store_true", help="run this instead of the sequence-length sweep")
    radial.add_argument(
        "--frame-size", type=_frame_size, default=(30, 52), help="tokens per frame, HxW (default: 30x52)"
    )
    radial.add_argument("--chunk-frames", type=int, default=3, help="latent frames per chunk (default: 3)")
    radial.add_argument("--sink-frames", type=int, default=3, help="sink frames (default: 3)")
    radial.add_argument("--window-frames", type=int, default=9, help="window frames (default: 9)")


def _add_distributed_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sp", type=int, default=2, help="sequence-parallel degree compared with 1 (default: 2)"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="video length per run (default: 3)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--model", default=None, help="pipeline folder (default: the embedded model, else a small random one)"
    )
    parser.add_argument(
        "--address", default=None, help="Ray cluster to join (default: RAY_ADDRESS, else local)"
    )
    parser.add_argument(
        "--projection-only", action="store_true", help="only the Wan-1.3B projection (no Ray, no model)"
    )


def _add_pipeline_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="video length (default: 600 for the long video; 20 with --preset on a GPU, one chunk on CPU)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--model", default=None, help="pipeline folder (default: the embedded model, else a random one)"
    )
    parser.add_argument(
        "--random-weights",
        action="store_true",
        help="random weights: of the default model's architecture, or of --preset's size",
    )
    parser.add_argument(
        "--compare-frames",
        type=int,
        default=257,
        help="frames for the SkyReels-V2 comparison, rounded up to whole windows; 0 skips it (default: 257)",
    )
    parser.add_argument(
        "--compare-size",
        type=int,
        default=64,
        help="SkyReels-V2 comparison frame side in pixels (default: 64)",
    )
    parser.add_argument(
        "--preset",
        default=None,
        choices=["wan2.1-t2v-1.3b-causal"],
        help="instead: the throughput of the preset's model size on a CUDA GPU",
    )
    parser.add_argument(
        "--allow-cpu",
        action="store_true",
        help="--preset on CPU: one chunk at 128x128, to test the code path",
    )
    parser.add_argument(
        "--height", type=int, default=None, help="--preset frame height (default: the preset's)"
    )
    parser.add_argument(
        "--width", type=int, default=None, help="--preset frame width (default: the preset's)"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the transformer blocks, as runtime.compile does (the first chunks compile)",
    )
    parser.add_argument(
        "--attention-backend",
        default=None,
        choices=["sdpa", "flex", "flash", "xformers"],
        help="force an attention backend (default: the best usable one)",
    )


def _add_quantize_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--layers", type=int, default=2, help="random Wan-1.3B-geometry blocks to measure (default: 2 of 30)"
    )
    parser.add_argument(
        "--frames", type=int, default=2, help="latent frames of the random input (default: 2)"
    )
    parser.add_argument(
        "--latent-side", type=int, default=16, help="latent height and width of the input (default: 16)"
    )
    parser.add_argument(
        "--eval-prompts",
        type=int,
        default=4,
        help="held-out prompts for the default model's eval with and without int8 (0: skip; default 4)",
    )
    parser.add_argument(
        "--eval-seconds", type=float, default=4.0, help="length of each eval video (default 4)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")


def _add_sessions_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sessions",
        type=_positive_ints,
        default=[1, 2, 4, 8],
        metavar="N,N,...",
        help="concurrent sessions to measure (default 1,2,4,8)",
    )
    parser.add_argument(
        "--seconds", type=float, default=6.0, help="video seconds each session makes (default 6)"
    )
    parser.add_argument("--model", default=None, help="model folder (default: the embedded default model)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: as set up)")
    parser.add_argument(
        "--lanes",
        type=int,
        default=0,
        help="batched forwards run at once (default: one per torch thread)",
    )


_TARGETS = {
    # target -> (module with main(args), function adding its options)
    "attention": ("vidgen.bench.attention", _add_attention_options),
    "pipeline": ("vidgen.bench.pipeline", _add_pipeline_options),
    "distributed": ("vidgen.bench.distributed", _add_distributed_options),
    "quantize": ("vidgen.bench.quantize", _add_quantize_options),
    "sessions": ("vidgen.bench.sessions", _add_sessions_options),
}


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    parser = sub.add_parser(name, help="run a benchmark: " + ", ".join(_TARGETS))
    targets = parser.add_subparsers(dest="target", metavar="TARGET")
    targets.required = True
    for target, (module_name, add_options) in _TARGETS.items():
        tp = targets.add_parser(target, help=f"benchmark {target}")
        tp.add_argument("--out-dir", default="outputs/bench", help="folder for the JSON table and PNG plot")
        add_options(tp)
        tp.set_defaults(run=_runner(module_name))


def _runner(module_name: str):
    def run(args: argparse.Namespace) -> int:
        return int(importlib.import_module(module_name).main(args) or 0)

    return run
