"""The form's fields: Gradio's own, drawn and bounded the same in the browser, whose values reach
the handler as they were sent.

Gradio checks a number's range, a slider's bounds and a dropdown's choices before the handler
runs, and refuses the request with its own error: a client of the API (``gradio_client``,
``/gradio_api/run``) then never sees the page's "**Check the form**" status, and a ``NaN`` or a
fraction is rounded away. The fields made here hand the raw value to the handler, where
:func:`~vidgen.ui.form.build_request` checks every one and names what to change. In the browser
nothing differs. (Each is Gradio's component with its ``preprocess`` replaced on the instance: a
subclass would make Gradio write a ``.pyi`` file beside this module.)
"""

from __future__ import annotations

from typing import Any, TypeVar

import gradio as gr

C = TypeVar("C", bound=gr.components.Component)


def _as_sent(payload: Any) -> Any:
    return payload


def raw(component: C) -> C:
    """``component``, its value handed to the handler as sent (no range or choice check)."""
    component.preprocess = _as_sent  # type: ignore[method-assign]
    return component


def table(component: gr.Dataframe) -> gr.Dataframe:
    """A storyboard table whose rows Gradio's reader refuses (a start that is no number, in a table
    of numbers) are handed over as sent, for the form to name the row."""
    read = component.preprocess

    def rows_or_as_sent(payload: Any) -> Any:
        try:
            return read(payload)
        except Exception:  # noqa: BLE001 - whatever Gradio cannot read: the form names it
            return payload

    component.preprocess = rows_or_as_sent  # type: ignore[method-assign]
    return component


__all__ = ["raw", "table"]
