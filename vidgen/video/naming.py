"""File names made from what a video shows (the CLI's default ``--out``, the page's download)."""

from __future__ import annotations


def video_file_name(what: str, suffix: str = ".mp4") -> str:
    """``a red ball, bouncing!`` -> ``a-red-ball-bouncing.mp4`` (at most 60 characters before the
    suffix; ``video.mp4`` when nothing is left)."""
    words = "".join(c if c.isalnum() else " " for c in what.lower()).split()
    return ("-".join(words)[:60].rstrip("-") or "video") + suffix
