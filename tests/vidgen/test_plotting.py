"""matplotlib is the tools' optional dependency (``vidgen[tools]``): without it a plot is one line
saying what to install."""

import sys

import pytest

from vidgen.plotting import pyplot
from vidgen.validation import InputError


def test_without_matplotlib_a_plot_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(InputError, match=r"pip install 'vidgen\[tools\]'"):
        pyplot()


def test_with_matplotlib_the_file_backend():
    plt = pyplot()
    assert plt.get_backend().lower() == "agg"
