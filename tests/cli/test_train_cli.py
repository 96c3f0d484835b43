"""``vidgen train``'s flags: made from the training configs' fields, with their docstrings as help."""

from __future__ import annotations

import dataclasses

import pytest

from vidgen.cli import build_parser
from vidgen.cli.train import field_docs
from vidgen.training.configs import AutoencoderTrainConfig, DistillTrainConfig, TransformerTrainConfig


def _help(part: str) -> str:
    parser = build_parser()
    train = next(a for a in parser._subparsers._group_actions[0].choices.values() if a.prog.endswith("train"))
    sub = train._subparsers._group_actions[0].choices[part]
    return " ".join(sub.format_help().split())


@pytest.mark.parametrize(
    ("part", "cls"),
    [
        ("autoencoder", AutoencoderTrainConfig),
        ("transformer", TransformerTrainConfig),
        ("distill", DistillTrainConfig),
    ],
)
def test_every_documented_field_is_explained_by_its_flag(part, cls, monkeypatch):
    """Each field with a docstring shows that docstring (whitespace joined) under its flag, with
    its default; the transformer's recipe flags are all documented."""
    monkeypatch.setenv("COLUMNS", "100000")  # no wrapping: argparse would break hyphenated words
    docs = field_docs(cls)
    shown = _help(part)
    for f in dataclasses.fields(cls):
        if f.name in docs and f.default is not dataclasses.MISSING and not isinstance(f.default, dict):
            assert f"--{f.name.replace('_', '-')}" in shown
            assert docs[f.name].replace("%%", "%") in shown, f.name
    if cls is TransformerTrainConfig:
        for name in ("direction_pairs", "direction_contrast", "self_context", "shape_swap", "object_weight"):
            assert name in docs and len(docs[name]) > 40


def test_field_docs_reads_the_docstring_under_each_field():
    """A field's docstring is the string right under it; a field without one has none, and the
    next field's is not taken for it."""

    @dataclasses.dataclass
    class Example:
        plain: int = 1
        documented: float = 2.0
        """Spread over
        two lines."""
        last: str = "x"

    assert field_docs(Example) == {"documented": "Spread over two lines."}
    assert "Pairs per step" in field_docs(TransformerTrainConfig)["direction_pairs"]
