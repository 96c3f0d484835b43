"""``benchmarks/mutation.py``: which mutants a module gets, and that each is the one change named."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("benchmarks_mutation", ROOT / "benchmarks/mutation.py")
assert _spec is not None and _spec.loader is not None
mutation = importlib.util.module_from_spec(_spec)
sys.modules["benchmarks_mutation"] = mutation  # dataclasses look their module up
_spec.loader.exec_module(mutation)

SOURCE = '''\
def f(x: int = 1, *, flag: bool = True) -> float:
    """Docstring."""
    # a comment that stays
    if not flag and x <= 2:
        log(f"x is {x + 1}")
    return -x * min(x, 3)
'''


def test_the_mutants_of_a_function():
    mutants, texts = mutation.mutants_of(SOURCE)
    assert [(m.line, m.description) for m in mutants] == [
        (1, "`1` -> `2`"),
        (1, "`True` -> `False`"),
        (4, "`and` -> `or`"),
        (4, "drop `not`"),
        (4, "`<=` -> `<`"),
        (4, "`2` -> `3`"),
        (5, "drop the call statement"),  # the f-string's `x + 1` is left alone
        (6, "`*` -> `/`"),
        (6, "drop unary `-`"),
        (6, "`min` -> `max`"),
        (6, "`3` -> `4`"),
    ]
    assert mutants[4].key == "if not flag and x <= 2: :: `<=` -> `<`#1"
    for text in texts:
        ast.parse(text)
        assert text != SOURCE
        assert "# a comment that stays" in text.splitlines()[2]  # lines before a change stay put
    assert texts[3].splitlines()[3] == "    if (flag) and x <= 2:"
    assert texts[6].splitlines()[4] == "        pass"
    assert texts[8].splitlines()[5] == "    return (x) * min(x, 3)"
    assert "-> float" in texts[0] and "x: int" in texts[0]  # annotations are never mutated


def test_every_listed_equivalent_mutant_exists():
    for file, keys in mutation.EQUIVALENT.items():
        assert set(keys) <= {m.key for m in mutation.list_mutants((ROOT / file).read_text())}, file
