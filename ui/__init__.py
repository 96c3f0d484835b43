"""vidgen.ui: the live Gradio page of ``vidgen serve`` (see :mod:`vidgen.ui.app`).

- ``app``: the page (:func:`~vidgen.ui.app.build_app`), serving and ``main``;
- ``handlers``: what Generate, Change prompt and Stop do;
- ``live``: a session's chunks to stream segments, live figures and the MP4;
- ``form``: the form to a checked ``GenerationRequest``;
- ``files``: the server's own folder.

Importing this package loads neither Gradio nor a model.
"""
