"""Which replica serves a session: the session id names its owner, and a lost owner's sessions go
to the replica that rendezvous hashing picks. Plain Python (no Ray), shared by the request router
(:mod:`vidgen.serving.router`) and its tests.
"""

from __future__ import annotations

import hashlib


def owner_of(session_id: str) -> str:
    """The replica id a session id names (empty for a malformed id)."""
    owner, sep, _ = session_id.partition(".")
    return owner if sep else ""


def fallback_replica(session_id: str, replica_ids: list[str]) -> str:
    """Rendezvous hashing: the replica with the highest hash of (session, replica) -- stable while
    that replica lives, whatever else joins or leaves."""
    return max(replica_ids, key=lambda rid: hashlib.sha256(f"{session_id}/{rid}".encode()).digest())
