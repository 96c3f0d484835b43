"""dispatch_attention: input validation, backend resolution order, automatic choice, the registry."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from vidgen.attention import (
    ENV_VAR,
    AttentionBackend,
    AttentionPattern,
    BackendUnavailableError,
    PatternKind,
    attention_backend,
    available_backends,
    backend_status,
    dispatch_attention,
    get_backend,
    register_backend,
    registered_backends,
    select_backend,
)
from vidgen.attention import registry as registry_module

WINDOW = AttentionPattern.sliding_window(frame_tokens=4, chunk_frames=1, window_frames=2)


# --------------------------------------------------------------------------- input validation
@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (((2, 5, 3), (2, 5, 3, 8), (2, 5, 3, 8)), r"must be 4-D \(B, S, H, D\); got q \(2, 5, 3\)"),
        (((2, 5, 3, 8), (1, 5, 3, 8), (1, 5, 3, 8)), r"disagree on batch \(B\)"),
        (((2, 5, 3, 8), (2, 5, 4, 8), (2, 5, 4, 8)), r"disagree on heads \(H\).*k \(2, 5, 4, 8\)"),
        (((2, 5, 3, 8), (2, 5, 3, 8), (2, 5, 3, 4)), r"disagree on head dim \(D\)"),
        (((2, 5, 3, 8), (2, 5, 3, 8), (2, 6, 3, 8)), r"k and v must have the same sequence length"),
    ],
)
def test_mismatched_shapes_name_the_shapes(shapes, message):
    q, k, v = (torch.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match=message):
        dispatch_attention(q, k, v)


def test_mismatched_dtypes_and_devices_are_named():
    q, k, v = torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 2, 8, dtype=torch.float64), torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="share a dtype; got q torch.float32, k torch.float64"):
        dispatch_attention(q, k, v)
    with pytest.raises(ValueError, match="one device; got q cpu, k meta"):
        dispatch_attention(q, torch.zeros(1, 4, 2, 8, device="meta"), v)
    with pytest.raises(ValueError, match="floating-point"):
        dispatch_attention(*(torch.zeros(1, 4, 2, 8, dtype=torch.int64) for _ in range(3)))


def test_pattern_lengths_are_checked():
    q, k, v = torch.zeros(1, 9, 2, 8), torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="q_len <= kv_len"):
        dispatch_attention(q, k, v, pattern=WINDOW)
    assert dispatch_attention(q, k, v).shape == (1, 9, 2, 8)  # full: cross-attention to fewer keys is fine


# --------------------------------------------------------------------------- choosing a backend
def test_unknown_backend_lists_the_known_ones(make_qkv):
    q, k, v = make_qkv(1, 4, 4)
    with pytest.raises(
        ValueError, match="unknown attention backend 'flsh'; known backends: flash, flex, sdpa"
    ):
        dispatch_attention(q, k, v, backend="flsh")
    with pytest.raises(ValueError, match="unknown attention backend 'nope'"), attention_backend("nope"):
        pass


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the messages of a machine without CUDA")
@pytest.mark.parametrize(
    ("name", "reasons"),
    [
        ("flash", ["flash-attn is not installed (pip install 'vidgen[gpu]')", "this machine has no CUDA"]),
        ("xformers", ["xformers is not installed (pip install 'vidgen[gpu]')", "needs CUDA tensors"]),
    ],
)
def test_unavailable_backends_say_why(name, reasons, make_qkv):
    q, k, v = make_qkv(1, 4, 4)
    with pytest.raises(BackendUnavailableError) as info:
        dispatch_attention(q, k, v, backend=name)
    message = str(info.value)
    assert f"'{name}' (chosen by the backend= argument) cannot run here" in message
    assert all(reason in message for reason in reasons)
    assert name not in available_backends()
    status = {s.name: s for s in backend_status()}[name]
    assert not status.usable and all(reason in status.reason for reason in reasons)


def test_backend_status_covers_every_backend():
    statuses = {s.name: s for s in backend_status()}
    assert set(statuses) == {"sdpa", "flex", "flash", "xformers"} <= set(registered_backends())
    assert statuses["sdpa"].usable and statuses["sdpa"].reason is None
    assert statuses["sdpa"].grad_devices and "cpu" in statuses["sdpa"].devices
    assert statuses["flex"].usable and statuses["flex"].grad_devices == ("cuda",)
    assert statuses["flash"].kinds == ("block_causal", "full", "radial", "sliding_window")
    assert {"sdpa", "flex"} <= set(available_backends())
    assert str(statuses["sdpa"]).startswith("sdpa") and "usable" in str(statuses["sdpa"])


def test_resolution_order_argument_over_context_over_env(monkeypatch, make_qkv):
    q, k, v = make_qkv(1, 8, 8)
    assert select_backend(q, k, v).name == "sdpa"  # automatic on CPU
    monkeypatch.setenv(ENV_VAR, "flex")
    assert select_backend(q, k, v, WINDOW).name == "flex"
    with attention_backend("sdpa"):
        assert select_backend(q, k, v, WINDOW).name == "sdpa"  # context manager beats env var
        assert select_backend(q, k, v, WINDOW, backend="flex").name == "flex"  # argument beats both
        with attention_backend(None):
            assert select_backend(q, k, v, WINDOW).name == "flex"  # None: back to env var
        assert select_backend(q, k, v, WINDOW).name == "sdpa"
    assert select_backend(q, k, v, WINDOW).name == "flex"  # context restored on exit
    monkeypatch.setenv(ENV_VAR, "flash")
    with pytest.raises(BackendUnavailableError, match=f"chosen by \\${ENV_VAR}"):
        dispatch_attention(q, k, v)
    monkeypatch.setenv(ENV_VAR, "sdap")
    with pytest.raises(ValueError, match="unknown attention backend 'sdap'"):
        dispatch_attention(q, k, v)


def test_context_manager_is_restored_after_an_error(make_qkv):
    q, k, v = make_qkv(1, 8, 8)
    with pytest.raises(RuntimeError, match="boom"), attention_backend("flex"):
        raise RuntimeError("boom")
    assert select_backend(q, k, v, WINDOW).name == "sdpa"


def test_explicit_flex_with_grad_on_cpu_points_at_sdpa(make_qkv):
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 8, 8))
    with pytest.raises(
        BackendUnavailableError, match="flex has no backward on cpu.*use backend 'sdpa' for training"
    ):
        dispatch_attention(q, k, v, pattern=WINDOW, backend="flex")


def test_automatic_choice_on_cpu_is_sdpa(monkeypatch):
    monkeypatch.setenv("VIDGEN_FLEX_COMPILE", "1")
    radial = AttentionPattern.radial((16, 16), range(40), chunk_frames=1, sink_frames=1)

    def chosen(pattern, length, grad=False):
        q, k, v = (torch.zeros(1, length, 1, 4, requires_grad=grad) for _ in range(3))
        return select_backend(q, k, v, pattern).name

    # every sparse pattern runs blockwise on sdpa (linear in length, with a backward)
    assert chosen(radial, 40 * 256) == "sdpa"
    assert chosen(AttentionPattern.full(), 1 << 14) == "sdpa"
    assert chosen(AttentionPattern.sliding_window(256, 1, 2), 1 << 14) == "sdpa"


def test_dispatch_runs_the_chosen_backend_and_keeps_the_layout(make_qkv, reference):
    q, k, v = make_qkv(2, 6, 20, heads=3, dim=8)
    with attention_backend("flex"):
        out = dispatch_attention(q, k, v, pattern=WINDOW)
    assert out.shape == (2, 6, 3, 8)  # (B, S_q, H, D)
    torch.testing.assert_close(out.double(), reference(q, k, v, WINDOW), atol=1e-5, rtol=0)


# --------------------------------------------------------------------------- registering backends
def test_register_a_custom_backend(monkeypatch, make_qkv, reference):
    registered_backends()  # load the built-ins before swapping the registry for a copy
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    calls = []

    def run(q, k, v, pattern, scale):
        calls.append(pattern.kind)
        return get_backend("sdpa").run(q, k, v, pattern, scale)

    custom = AttentionBackend(
        name="custom",
        run=run,
        devices=frozenset({"cpu"}),
        dtypes=frozenset({torch.float32}),
        kinds=frozenset({PatternKind.FULL, PatternKind.SLIDING_WINDOW}),
    )
    register_backend(custom)
    assert "custom" in available_backends()
    q, k, v = make_qkv(1, 12, 12)
    out = dispatch_attention(q, k, v, pattern=WINDOW, backend="custom")
    assert calls == [PatternKind.SLIDING_WINDOW]
    torch.testing.assert_close(out.double(), reference(q, k, v, WINDOW), atol=1e-5, rtol=0)
    with pytest.raises(
        BackendUnavailableError, match="custom supports patterns full, sliding_window, not block_causal"
    ):
        dispatch_attention(q, k, v, pattern=AttentionPattern.block_causal(2, 1), backend="custom")
    with pytest.raises(BackendUnavailableError, match="custom supports dtypes float32, not float64"):
        dispatch_attention(q.double(), k.double(), v.double(), backend="custom")
    with pytest.raises(BackendUnavailableError, match="inference only"):
        dispatch_attention(q.requires_grad_(), k, v, backend="custom")
    with pytest.raises(ValueError, match="already registered"):
        register_backend(custom)
    register_backend(dataclasses.replace(custom, probe=lambda: "needs a unicorn"), replace=True)
    assert "custom" not in available_backends()
    with pytest.raises(BackendUnavailableError, match="needs a unicorn"):
        dispatch_attention(q, k, v, backend="custom")


def test_import_is_light():
    code = (
        "import sys, vidgen.attention as a\n"
        "from vidgen.attention import backend_flex, registry\n"
        "assert registry._PROBES == {}, registry._PROBES\n"
        "assert backend_flex._compiled_fn is None\n"
        "assert not any(m.split('.')[0] in ('flash_attn', 'xformers') for m in sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
