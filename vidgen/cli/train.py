"""``vidgen train``: train the default model's parts on Shapes World, resumably, in stretches.

    vidgen train autoencoder --run-dir runs/ae --minutes 60
    vidgen train finalize-autoencoder --run-dir runs/ae --out runs/ae/final
    vidgen train transformer --run-dir runs/dit --autoencoder runs/ae/final --minutes 120
    vidgen train export --transformer-run runs/dit --autoencoder runs/ae/final --out vidgen/default_model
    vidgen train average runs/sf-a/pipeline runs/sf-b/pipeline --out runs/soup
    vidgen train distill --stage ode --teacher vidgen/default_model --run-dir runs/distill-ode
    vidgen train distill --stage self-forcing --teacher vidgen/default_model --init-from runs/distill-ode \
        --run-dir runs/distill-sf

Every option of the training configs (``vidgen.training.*TrainConfig``) is a flag; rerunning the
same command continues from ``RUN_DIR/latest``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
import typing

from vidgen.validation import InputError


@functools.cache
def field_docs(cls) -> dict[str, str]:
    """The docstrings under a dataclass's fields (and its bases'), by field name, whitespace joined:
    the help of the flags made from them. Empty where the source cannot be read."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for here, after in zip(body, body[1:]):
            if (
                isinstance(here, ast.AnnAssign)
                and isinstance(here.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[here.target.id] = " ".join(after.value.value.split())
    return docs


def _add_dataclass_options(parser: argparse.ArgumentParser, cls) -> None:
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        # argparse formats help with %: a literal percent sign in a docstring must be doubled
        about = docs.get(f.name, "").replace("%", "%%")
        shown = f"{about} (default {default})".strip()
        if kind is bool:
            parser.add_argument(
                flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=default, help=shown
            )
        elif kind in (int, float, str):
            parser.add_argument(flag, type=kind, default=default, help=shown)
        elif typing.get_origin(kind) is typing.Literal:
            parser.add_argument(flag, choices=typing.get_args(kind), default=default, help=about or None)


def _config_from_args(cls, args: argparse.Namespace):
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vars(args).items() if k in names and v is not None}
    return cls(**values)


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    from vidgen.training.configs import AutoencoderTrainConfig, DistillTrainConfig, TransformerTrainConfig

    parser = sub.add_parser(name, help="train the default model (autoencoder, transformer) on Shapes World")
    parts = parser.add_subparsers(dest="part", metavar="PART")
    parts.required = True

    ae = parts.add_parser("autoencoder", help="train the autoencoder")
    _add_dataclass_options(ae, AutoencoderTrainConfig)
    ae.set_defaults(run=_run_autoencoder)

    fin = parts.add_parser("finalize-autoencoder", help="save EMA weights with measured latent statistics")
    fin.add_argument("--run-dir", required=True)
    fin.add_argument("--out", required=True)
    fin.set_defaults(run=_run_finalize)

    tr = parts.add_parser("transformer", help="train the causal transformer with diffusion forcing")
    _add_dataclass_options(tr, TransformerTrainConfig)
    tr.set_defaults(run=_run_transformer)

    ds = parts.add_parser("distill", help="distil a many-step teacher to the pipeline's few steps")
    _add_dataclass_options(ds, DistillTrainConfig)
    ds.set_defaults(run=_run_distill)

    cp = parts.add_parser("compact", help="a small copy of a run's latest state, to keep in the repository")
    cp.add_argument("--run-dir", required=True)
    cp.add_argument("--out", required=True)
    cp.add_argument(
        "--without-ema", action="store_true", help="the weights alone, not their average (half the size)"
    )
    cp.set_defaults(run=_run_compact)

    cu = parts.add_parser("curve", help="add a `vidgen eval` report to the training curve and draw it")
    cu.add_argument("--report", required=True, help="report.json written by `vidgen eval --held-out N`")
    cu.add_argument("--run-dir", help="transformer run whose latest checkpoint was evaluated")
    cu.add_argument("--step", type=int, help="training step (instead of --run-dir)")
    cu.add_argument("--hours", type=float, help="training wall hours (instead of --run-dir)")
    cu.add_argument("--curve", default="vidgen/default_model/curve.json", help="the points (JSON)")
    cu.add_argument("--png", default="vidgen/default_model/training_curve.png", help="the picture")
    cu.add_argument("--note", default="", help="what changed at this point (recipe, schedule)")
    cu.set_defaults(run=_run_curve)

    ex = parts.add_parser("export", help="assemble a pipeline folder from trained parts")
    ex.add_argument("--transformer-run", required=True, help="transformer run folder (its latest checkpoint)")
    ex.add_argument(
        "--weights",
        default="ema",
        choices=["ema", "raw"],
        help="the checkpoint's EMA weights, or its raw ones (a branch younger than the EMA's horizon)",
    )
    ex.add_argument("--autoencoder", required=True, help="finalized autoencoder folder")
    ex.add_argument("--out", required=True, help="pipeline folder to write (e.g. vidgen/default_model)")
    ex.add_argument(
        "--dtype", default="float16", choices=["float32", "float16", "bfloat16"], help="stored weights"
    )
    ex.set_defaults(run=_run_export)

    av = parts.add_parser("average", help="a model soup: pipeline folders' transformers averaged")
    av.add_argument("folders", nargs="+", help="pipeline folders of one architecture (e.g. RUN/pipeline)")
    av.add_argument("--out", required=True, help="pipeline folder to write (a copy of the first)")
    av.add_argument(
        "--dtype", default="float16", choices=["float32", "float16", "bfloat16"], help="stored weights"
    )
    av.set_defaults(run=_run_average)


def _run_autoencoder(args: argparse.Namespace) -> int:
    from vidgen.training.autoencoder import train_autoencoder
    from vidgen.training.configs import AutoencoderTrainConfig

    train_autoencoder(_config_from_args(AutoencoderTrainConfig, args))
    return 0


def _run_finalize(args: argparse.Namespace) -> int:
    from vidgen.training.autoencoder import finalize_autoencoder

    finalize_autoencoder(args.run_dir, args.out)
    print(f"wrote {args.out}")
    return 0


def _run_transformer(args: argparse.Namespace) -> int:
    from vidgen.training.configs import TransformerTrainConfig
    from vidgen.training.transformer import check_config, train_transformer

    config = _config_from_args(TransformerTrainConfig, args)
    try:
        check_config(config)
    except ValueError as err:
        raise InputError(str(err)) from None
    try:
        train_transformer(config)
    except FileNotFoundError as err:
        raise InputError(str(err)) from None
    return 0


def _run_distill(args: argparse.Namespace) -> int:
    from vidgen.training.configs import DistillTrainConfig
    from vidgen.training.distill import DistillSetupError, train_distill

    try:
        config = _config_from_args(DistillTrainConfig, args)
    except ValueError as err:
        raise InputError(str(err)) from None
    if not config.teacher:
        raise InputError("--teacher is required: a pipeline folder or a transformer training run")
    try:
        print(f"wrote {train_distill(config)}")
    except (FileNotFoundError, DistillSetupError) as err:
        raise InputError(str(err)) from None
    return 0


def _run_compact(args: argparse.Namespace) -> int:
    from vidgen.training.checkpoint import export_compact_checkpoint

    print(f"wrote {export_compact_checkpoint(args.run_dir, args.out, with_ema=not args.without_ema)}")
    return 0


def _run_curve(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from vidgen.training.curve import add_point, curve_point, plot_curve

    if args.run_dir:
        state_file = Path(args.run_dir) / "latest" / "state.json"
        if not state_file.is_file():
            raise InputError(f"no checkpoint in {args.run_dir} (missing {state_file})")
        state = json.loads(state_file.read_text())
        step, hours = state["step"], state["wall_seconds"] / 3600
    elif args.step is not None and args.hours is not None:
        step, hours = args.step, args.hours
    else:
        raise InputError("say which checkpoint was evaluated: --run-dir RUN, or --step N --hours H")
    try:
        report = json.loads(Path(args.report).read_text())
        point = curve_point(report, step, hours, args.note)
    except (OSError, ValueError) as err:
        raise InputError(f"{args.report}: {err}") from None
    points = add_point(args.curve, point)
    plot_curve(points, args.png)
    print(f"{len(points)} points in {args.curve}; drew {args.png}")
    return 0


def _run_export(args: argparse.Namespace) -> int:
    from vidgen.training.export import export_pipeline

    folder = export_pipeline(
        args.transformer_run, args.autoencoder, args.out, dtype=args.dtype, weights=args.weights
    )
    print(f"wrote {folder}")
    return 0


def _run_average(args: argparse.Namespace) -> int:
    from vidgen.training.export import average_pipelines

    print(f"wrote {average_pipelines(args.folders, args.out, dtype=args.dtype)}")
    return 0
