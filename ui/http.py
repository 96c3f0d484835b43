"""An HTTP guard of the page's server: no request body beyond a size (``--max-upload-mb``).

Gradio's own ``max_file_size`` bounds each file of an upload, but one upload request may carry a
thousand files, and a JSON request (``/queue/join``) has no bound at all. :class:`BodySizeLimit`
(plain ASGI, installed with ``launch(app_kwargs={"middleware": [...]})``) answers HTTP 413 to a
body that says it is larger than the limit, and cuts off one that grows past it unannounced.
"""

from __future__ import annotations

import json
from typing import Any

FORM_OVERHEAD = 64 * 1024
"""Bytes a multipart form adds around the largest allowed file (boundaries, field headers)."""


class BodySizeLimit:
    """ASGI middleware: request bodies of at most one file of ``max_file_bytes`` and its form."""

    def __init__(self, app: Any, max_file_bytes: int) -> None:
        self.app = app
        self.max_file_bytes = int(max_file_bytes)
        self.max_bytes = self.max_file_bytes + FORM_OVERHEAD

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        try:
            too_large = declared is not None and int(declared) > self.max_bytes
        except ValueError:
            too_large = True  # an unreadable length is no promise
        if too_large:
            await self._refuse(send)
            return
        received = 0

        async def counted() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:  # no (or a false) Content-Length: stop reading
                    return {"type": "http.disconnect"}
            return message

        await self.app(scope, counted, send)

    async def _refuse(self, send: Any) -> None:
        mb = self.max_file_bytes / 1_000_000
        body = json.dumps({"detail": f"too large: this server accepts files of up to {mb:g} MB"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
