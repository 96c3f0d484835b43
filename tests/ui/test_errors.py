"""The server log of refused requests (``vidgen.ui.errors``): one line per refusal, rate-limited,
never an exception of its own; our own failures keep their tracebacks."""

from __future__ import annotations

import logging

import gradio as gr

from vidgen.ui.errors import RefusalLog, is_refusal
from vidgen.validation import InputError


class _Hostile:
    """A frame local whose attributes raise (Gradio's event data did: it made the log raise inside
    Gradio's error handling, and the client waited for ever)."""

    def __getattr__(self, name):
        raise TypeError("argument of type 'NoneType' is not iterable")


def _refuse(log: RefusalLog, error: BaseException) -> None:
    event = _Hostile()  # noqa: F841  (read from this frame by the log)
    try:
        raise error
    except BaseException:
        log.print_exc()


def test_refusals_are_one_line_each_then_counted(caplog, capsys):
    log = RefusalLog(burst=3, period=3600.0)
    with caplog.at_level(logging.WARNING, logger="vidgen.ui"):
        for k in range(5):
            _refuse(log, gr.Error(f"Value {k} is less than minimum value 1."))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all(line.startswith("refused a request to ?") for line in lines)
    assert "Value 0 is less than minimum value 1." in lines[0]
    assert log._left_out == 2
    assert "Traceback" not in capsys.readouterr().err
    log.period = 0.0  # the next window opens: the ones left out are counted in one line
    with caplog.at_level(logging.WARNING, logger="vidgen.ui"):
        _refuse(log, InputError("the prompt is empty"))
    assert "... and 2 more refused requests" in caplog.records[-2].getMessage()


def test_our_own_failures_keep_their_traceback(capsys):
    _refuse(RefusalLog(), RuntimeError("a bug of ours"))
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: a bug of ours" in err


def test_what_counts_as_a_refusal():
    assert is_refusal(gr.Error("x")) and is_refusal(InputError("x"))
    assert not is_refusal(RuntimeError("x")) and not is_refusal(KeyError("x")) and not is_refusal(None)
