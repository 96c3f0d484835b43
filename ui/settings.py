"""How ``vidgen serve`` runs: :class:`ServeSettings`, checked before anything heavy is imported.

Light on purpose (no torch, no Gradio): the command checks its options here before the model
loads, so a mistake is one line and exit status 2 (``vidgen.cli.main`` prints the
:class:`~vidgen.validation.InputError`).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from vidgen.validation import InputError, check_number

MAX_SLOTS = 256
"""Most chunks made or videos streamed at once (far beyond what one process holds)."""
MAX_QUEUE = 4096
MAX_TTL = 365 * 24 * 3600.0
"""Longest time to live of a finished video's files (a year)."""
MAX_SEGMENT_SECONDS = 60.0
MAX_LEAD = 3600.0
MAX_UPLOAD_MB = 10 * 1024.0
MAX_SESSION_SECONDS = 7 * 24 * 3600.0


@dataclass
class ServeSettings:
    """How the server runs (``vidgen serve`` options); every field is checked on creation."""

    concurrency: int = 1
    """Chunk steps made at the same time; the streams take turns for these slots chunk by chunk."""
    batch_sessions: int = 4
    """Streams whose chunks one slot makes together, as one batched transformer call per step
    (1: one stream per slot)."""
    history_mb: float = 64.0
    """Each stream's states kept so that it can go back (the page's "back" control), in MB."""
    streams: int = 4
    """Videos streamed at the same time (each holds its own KV cache); more wait in the queue."""
    queue_size: int = 8
    """Requests that may wait for a stream; beyond that the page says the server is busy."""
    file_ttl: float = 3600.0
    """Seconds a finished video's files are kept."""
    segment_seconds: float = 1.0
    max_lead: float = 3.0
    upscale: int = 1
    """The player's and the download's frames are this many times the model's."""
    resample: str = "nearest"
    max_upload_mb: float = 32.0
    """Largest file (start image or clip) the server accepts, in MB; a larger upload is refused."""
    max_side: int | None = None
    """Largest height or width a request may ask for (None: twice the model's default size)."""
    max_steps: int | None = None
    """Most sampler steps a request may ask for (None: twice the model's default, at least 16)."""
    max_session_seconds: float = 0.0
    """Wall-clock seconds one video may stream before it is ended (0: no limit)."""

    def __post_init__(self) -> None:
        def whole(name: str, value, minimum: int, maximum: int) -> int:
            return check_number(name, value, integer=True, minimum=minimum, maximum=maximum)

        def number(name: str, value, minimum: float, maximum: float) -> float:
            return float(check_number(name, value, minimum=minimum, maximum=maximum))

        self.concurrency = whole("--concurrency", self.concurrency, 1, MAX_SLOTS)
        self.streams = whole("--streams", self.streams, 1, MAX_SLOTS)
        self.batch_sessions = whole("--batch-sessions", self.batch_sessions, 1, MAX_SLOTS)
        self.history_mb = number("--history-mb", self.history_mb, 0.0, 1 << 20)
        self.queue_size = whole("--queue-size", self.queue_size, 1, MAX_QUEUE)
        self.file_ttl = number("--file-ttl", self.file_ttl, 1.0, MAX_TTL)
        self.segment_seconds = number("--segment-seconds", self.segment_seconds, 1.0, MAX_SEGMENT_SECONDS)
        self.max_lead = number("--max-lead", self.max_lead, 0.0, MAX_LEAD)
        self.max_upload_mb = number("--max-upload-mb", self.max_upload_mb, 0.01, MAX_UPLOAD_MB)
        if self.max_side is not None:
            self.max_side = whole("--max-side", self.max_side, 1, 1 << 16)
        if self.max_steps is not None:
            self.max_steps = whole("--max-steps", self.max_steps, 1, 1 << 16)
        self.max_session_seconds = number(
            "--max-session-seconds", self.max_session_seconds, 0.0, MAX_SESSION_SECONDS
        )
        self.upscale = whole("--upscale", self.upscale, 1, 16)
        if self.resample not in ("nearest", "lanczos"):
            raise InputError(f"--resample must be 'nearest' or 'lanczos', got {self.resample!r}")

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1_000_000)


def check_address(host: str, port: int) -> None:
    """:class:`InputError` unless this process can listen on ``host:port`` now (a port 1-65535, a
    host that names a local address, the port free), so the model is not loaded for nothing."""
    port = check_number("--port", port, integer=True, minimum=1, maximum=65535)
    if not isinstance(host, str) or not host.strip() or any(c.isspace() for c in host):
        raise InputError(f"--host must be an address such as 127.0.0.1, got {host!r}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as err:
        raise InputError(f"--host {host}: not an address of this machine ({err})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server itself binds
        try:
            probe.bind(address)
        except OSError as err:
            raise InputError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
