"""Matplotlib for the tools' plots (``vidgen eval``, ``bench``, ``train curve``): an optional
dependency (``pip install 'vidgen[tools]'``), imported only when a plot is drawn."""

from __future__ import annotations

from typing import Any

from vidgen.validation import InputError


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend; :class:`InputError` (one line, exit 2)
    when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise InputError("drawing this plot needs matplotlib: pip install 'vidgen[tools]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
