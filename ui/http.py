"""An HTTP guard of the page's server: no request body beyond a size (``--max-upload-mb``).

Gradio's own ``max_file_size`` bounds each file of an upload, but one upload request may carry a
thousand files, and a JSON request (``/queue/join``) has no bound at all. :class:`BodySizeLimit`
(plain ASGI, installed with ``launch(app_kwargs={"middleware": [...]})``) reads a request's body
before the page does, counting the bytes as they arrive, whatever the request says of its length:

- past the limit (a ``Content-Length`` that says so, or a chunked or lying body that grows past it)
  the answer is HTTP 413 at once, and the page never sees the request;
- a multipart form that ends before its closing boundary (a ``Content-Length`` shorter than the
  body: the server stops reading there) is HTTP 400, never an upload cut short and accepted.

The body is held in memory up to the limit (one file and its form) and then handed to the page.
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
        headers = dict(scope.get("headers") or ())
        declared = headers.get(b"content-length")
        try:
            too_large = declared is not None and int(declared) > self.max_bytes
        except ValueError:
            too_large = True  # an unreadable length is no promise
        if too_large:
            await self._refuse(send, 413, self._too_large())
            return
        if scope.get("method") in ("GET", "HEAD", "OPTIONS") and declared is None:
            await self.app(scope, receive, send)  # no body: nothing to hold (and streams stay streams)
            return

        parts: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before its body was whole: there is no one to answer
            body = message.get("body", b"")
            received += len(body)
            if received > self.max_bytes:  # chunked, or longer than it said: refused as it grows
                await self._refuse(send, 413, self._too_large())
                return
            parts.append(body)
            if not message.get("more_body", False):
                break
        body = b"".join(parts)
        boundary = _multipart_boundary(headers.get(b"content-type", b""))
        if boundary is not None and not body.rstrip(b"\r\n").endswith(b"--" + boundary + b"--"):
            await self._refuse(
                send,
                400,
                "the form ended before its closing boundary: the body is not the length its "
                "Content-Length says",
            )
            return

        delivered = False

        async def replay() -> dict:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the client's disconnect, when it comes

        await self.app(scope, replay, send)

    def _too_large(self) -> str:
        return f"too large: this server accepts files of up to {self.max_file_bytes / 1_000_000:g} MB"

    async def _refuse(self, send: Any, status: int, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _multipart_boundary(content_type: bytes) -> bytes | None:
    """The boundary of a ``multipart/form-data`` content type, or None for any other."""
    kind, _, params = content_type.partition(b";")
    if kind.strip().lower() != b"multipart/form-data":
        return None
    for param in params.split(b";"):
        name, _, value = param.strip().partition(b"=")
        if name.strip().lower() == b"boundary":
            return value.strip().strip(b'"') or None
    return None
