"""The page's wiring, built on a stand-in backend: no model is needed to build it, the endpoints
and queue are as documented, and importing the module loads nothing heavy."""

from __future__ import annotations

import subprocess
import sys

import gradio as gr
import pytest

from tests.ui.test_live import FakeBackend
from tests.video.conftest import flat_colour_clip
from vidgen.ui.app import ServeSettings, build_app
from vidgen.ui.files import ServerFiles


def test_importing_the_page_loads_neither_gradio_nor_a_model():
    code = (
        "import sys\n"
        "from vidgen.pipelines import LongVideoPipeline\n"
        "def refuse(*a, **k): raise SystemExit('a model was loaded at import')\n"
        "LongVideoPipeline.from_pretrained = refuse\n"
        "import vidgen.ui, vidgen.ui.app\n"
        "print('gradio' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.fixture(scope="module")
def demo(tiny_sessions, tmp_path_factory):
    files = ServerFiles.create(60, parent=tmp_path_factory.mktemp("files"))
    backend = FakeBackend(flat_colour_clip(8))  # the page never asks a backend for its model
    yield build_app(backend, tiny_sessions.info, files, ServeSettings(concurrency=2, streams=5, queue_size=3))
    files.cleanup()


def test_endpoints_and_queue(demo):
    public = {fn.api_name for fn in demo.fns.values() if fn.api_visibility == "public"}
    assert public == {"generate", "change_prompt", "go_back", "stop"}
    by_name = {fn.api_name: fn for fn in demo.fns.values()}
    assert by_name["generate"].queue and by_name["generate"].concurrency_id == "generate"
    # steering a stream must not wait behind the generations in the queue
    assert not by_name["change_prompt"].queue and not by_name["stop"].queue and not by_name["go_back"].queue
    # Gradio's slots are the streams; the chunks they make take turns for --concurrency slots
    assert demo._queue.max_size == 3 and demo._queue.default_concurrency_limit == 5
    handlers = by_name["generate"].fn.__self__
    assert handlers.settings.turns.slots == 2 * 4  # each of the 2 slots steps up to 4 streams batched
    # a tab's finished streams are dropped from Gradio's own store, which passes the tab's request
    assert handlers.streams is demo.pending_streams
    assert gr.utils.get_type_hints(by_name["generate"].fn)["page"] == (gr.Request | None)


def test_the_video_streams_and_each_tab_has_its_own_state(demo):
    (video,) = [b for b in demo.blocks.values() if isinstance(b, gr.Video)]
    assert video.streaming and video.autoplay
    (state,) = [b for b in demo.blocks.values() if isinstance(b, gr.State)]
    assert state.value is None and state.delete_callback is not None


def test_serve_settings_check_the_upscale():
    """``vidgen serve --upscale`` is checked before the model loads (main prints it as one line)."""
    assert ServeSettings(upscale=4, resample="lanczos").upscale == 4
    with pytest.raises(ValueError, match="--upscale must be at least 1"):
        ServeSettings(upscale=0)
    with pytest.raises(ValueError, match="'nearest' or 'lanczos'"):
        ServeSettings(upscale=2, resample="cubic")


def test_the_page_config_reaches_no_model(tiny_sessions, tmp_path, monkeypatch):
    """Gradio deep-copies the page's config on every ``GET /config`` (each client's first request).
    Built on the real session manager, whose pipeline holds the weights, nothing of it may be
    copied: a bound method in a component's settings (``gr.State``'s delete callback) copied its
    object, and with it every weight (0.9 s and +300 MB a request with the default model)."""
    import torch
    from gradio.utils import safe_deepcopy

    files = ServerFiles.create(60, parent=tmp_path)
    try:
        app = build_app(tiny_sessions, tiny_sessions.info, files, ServeSettings())
        copied = []
        original = torch.Tensor.__deepcopy__

        def counting(self, memo):
            copied.append(tuple(self.shape))
            return original(self, memo)

        monkeypatch.setattr(torch.Tensor, "__deepcopy__", counting)
        safe_deepcopy(app.config)
        assert copied == []
    finally:
        files.cleanup()
