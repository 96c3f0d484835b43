"""The live page under load (slow): several clients at once, and the server's memory comes back
once their sessions end (``tests/ui/load.py`` runs the server and the clients)."""

from __future__ import annotations

import pytest

from tests.ui.load import run_load

pytest.importorskip("gradio_client")


@pytest.mark.slow
def test_memory_comes_back_after_sessions_end(tmp_path):
    """Warm-up: one 64x64 video per client. Then three clients ask for two 256x256 videos each at
    once; when they have ended, the server's RSS is within 10 % of what it was after the warm-up,
    and of what it was before any video (the model loaded). Measured with ``trim_heap``: 1018 MB
    started, 767 after warm-up, 764 after. Without it the freed memory stays with the C heap, and
    how much the warm-up already holds varies: 975, 1571, 1422 (+46 % of started); with four
    videos per client 973, 1145, 1306 (+14 % of the warm-up)."""
    result = run_load(
        clients=3,
        generations=2,
        seconds=2.0,
        size=256,
        server_args=["--concurrency", "1", "--streams", "3", "--queue-size", "12", "--max-side", "256"],
        tmp=tmp_path,
    )
    assert all(s.startswith("**Done**") for s in result.statuses) and len(result.statuses) == 3 + 6
    figures = (
        f"RSS {result.started_mb:.0f} MB started, {result.warm_mb:.0f} warm, {result.after_mb:.0f} after"
    )
    assert result.growth < 0.10, figures
    assert result.after_mb < 1.10 * result.started_mb, figures
    print(figures)
