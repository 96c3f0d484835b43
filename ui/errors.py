"""The server log of refused requests: one line each, rate-limited; full tracebacks only for ours.

Gradio prints a full traceback for every request whose inputs its components refuse (a value past
a field's range, a choice not offered, a table that is not one): 34 in one malformed-payload run,
a log any client can flood. :func:`install` puts :class:`RefusalLog` in place of the ``traceback``
module Gradio's request handlers print with: a refusal (a Gradio ``Error``, a payload the data
model rejects, a vidgen ``InputError``) becomes one line naming the endpoint and session, at most
``burst`` lines per ``period`` seconds (then one line counting those left out); anything else is
printed in full, as before.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from types import ModuleType, TracebackType
from typing import Any

from vidgen.validation import InputError

logger = logging.getLogger("vidgen.ui")


def is_refusal(error: BaseException | None) -> bool:
    """Whether ``error`` refuses a request's input (the client's to fix) rather than fails on ours."""
    if error is None:
        return False
    if isinstance(error, InputError):
        return True
    kind = type(error)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if name == "gradio.exceptions.Error":  # a component's preprocess: range, choices, type
        return True
    if name.endswith("ValidationError") and kind.__module__.startswith(("pydantic", "pydantic_core")):
        return True  # a payload Gradio's data model cannot read
    return isinstance(error, ValueError) and "didn't receive enough input values" in str(error)


def _where(tb: TracebackType | None) -> tuple[str, str]:
    """(endpoint, session) of the request an exception was raised in, read from the ``event`` or
    ``body`` of Gradio's handler frames; "?" where they do not say."""
    endpoint = session = "?"
    while tb is not None:
        for name in ("event", "body"):
            value = tb.tb_frame.f_locals.get(name)
            if value is None:
                continue
            try:
                hash_ = getattr(value, "session_hash", None)
                fn = getattr(value, "fn", None)
                api_name = getattr(fn, "api_name", None)
            except Exception:  # a frame's local is anything: an attribute may raise
                continue
            if isinstance(hash_, str) and session == "?":
                session = hash_[:12]
            if isinstance(api_name, str) and endpoint == "?":
                endpoint = "/" + api_name.lstrip("/")
        tb = tb.tb_next
    return endpoint, session


class RefusalLog:
    """Stands in for the ``traceback`` module in Gradio's request handlers (see the module docstring)."""

    def __init__(self, burst: int = 10, period: float = 10.0) -> None:
        self.burst, self.period = burst, period
        self._lock = threading.Lock()
        self._window = 0.0
        self._logged = 0
        self._left_out = 0

    def print_exc(self, *args: Any, **kwargs: Any) -> None:
        error, tb = sys.exc_info()[1], sys.exc_info()[2]
        if not is_refusal(error):
            traceback.print_exc(*args, **kwargs)
            return
        try:  # it runs inside Gradio's own error handling: it must never raise
            self._log_refusal(error, tb)
        except Exception:
            traceback.print_exc(*args, **kwargs)

    def _log_refusal(self, error: BaseException | None, tb: TracebackType | None) -> None:
        assert error is not None  # a refusal is an exception
        endpoint, session = _where(tb)
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        with self._lock:
            now = time.monotonic()
            if now - self._window >= self.period:
                if self._left_out:
                    logger.warning("... and %d more refused requests in %g s", self._left_out, self.period)
                self._window, self._logged, self._left_out = now, 0, 0
            if self._logged >= self.burst:
                self._left_out += 1
                return
            self._logged += 1
        logger.warning("refused a request to %s (session %s): %s", endpoint, session, first_line)

    def __getattr__(self, name: str) -> Any:  # everything else: the traceback module's
        return getattr(traceback, name)


def install(log: RefusalLog | None = None) -> RefusalLog:
    """Put ``log`` (a new :class:`RefusalLog`) in place of ``traceback`` in Gradio's request
    handling modules; idempotent."""
    import gradio.queueing
    import gradio.routes
    import gradio.utils

    log = log or RefusalLog()
    for module in (gradio.queueing, gradio.routes, gradio.utils):
        current = getattr(module, "traceback", None)
        if isinstance(current, RefusalLog):
            continue
        if isinstance(current, ModuleType):
            module.traceback = log  # type: ignore[attr-defined]
    return log
