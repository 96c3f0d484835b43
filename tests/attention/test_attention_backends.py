"""Every backend usable here against a float64 dense reference, including gradients for sdpa.

Tolerance: outputs and gradients computed in float32 must match the float64 reference to
1e-5 (absolute, with inputs ~N(0, 1) and softmax outputs O(1)).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vidgen.attention import AttentionPattern, backend_flex, backend_sdpa, blockwise, dispatch_attention
from vidgen.attention.blockwise import plan_blockwise, plan_steps, run_blockwise
from vidgen.attention.cache import LRUCache

ATOL = 1e-5

# (id, pattern, q_len, kv_len): the edges the backends must get right
CASES = [
    ("full", AttentionPattern.full(), 37, 37),
    ("full-cross-attention", AttentionPattern.full(), 40, 11),
    ("block-causal-first-chunk-only", AttentionPattern.block_causal(6, 2), 12, 12),
    ("block-causal-odd-length", AttentionPattern.block_causal(5, 2), 53, 53),
    ("block-causal-suffix", AttentionPattern.block_causal(5, 2), 10, 53),
    ("block-causal-suffix-mid-chunk", AttentionPattern.block_causal(5, 2), 7, 53),
    ("window-longer-than-history", AttentionPattern.sliding_window(4, 1, 16), 30, 30),
    ("window-sinks-inside-window", AttentionPattern.sliding_window(3, 2, 4, sink_frames=2), 40, 40),
    ("window-sinks-outside-window", AttentionPattern.sliding_window(3, 1, 2, sink_frames=2), 61, 61),
    ("window-no-sinks-odd-length", AttentionPattern.sliding_window(4, 2, 2), 45, 45),
    ("window-zero-window", AttentionPattern.sliding_window(4, 1, 0, sink_frames=1), 33, 33),
    ("window-suffix-with-sinks", AttentionPattern.sliding_window(3, 1, 2, sink_frames=1), 9, 61),
    ("window-one-query", AttentionPattern.sliding_window(3, 1, 2, sink_frames=1), 1, 61),
    # radial: a chunk over a ring-wrapped cache (sinks 0-1, window 5,6,3,4), two chunks in flight,
    # and frames of 150 tokens that straddle FlexAttention's 128-token blocks
    (
        "radial-ring",
        AttentionPattern.radial(
            (3, 4), [0, 1, 5, 6, 3, 4, 7, 8], chunk_frames=2, sink_frames=2, band_rows=1, tile_rows=2
        ),
        24,
        96,
    ),
    (
        "radial-two-chunks",
        AttentionPattern.radial(
            (3, 4), range(6), chunk_frames=2, query_frames=4, dense_frames=0, band_rows=0, tile_rows=1
        ),
        48,
        72,
    ),
    (
        "radial-crosses-flex-blocks",
        AttentionPattern.radial((6, 25), range(6), chunk_frames=2, sink_frames=2, band_rows=1, tile_rows=2),
        300,
        900,
    ),
    ("window-crosses-flex-blocks", AttentionPattern.sliding_window(40, 1, 2, sink_frames=1), 300, 300),
]
CASE_IDS = [c[0] for c in CASES]
BLOCK_CASES = [c for c in CASES if c[1].has_key_ranges]


@pytest.fixture(
    params=[(0, None), (0, 512), (7, None), (256, None)],
    ids=["chunks", "chunks-tiny-gather", "steps-7", "steps-256"],
)
def step_sizes(request, monkeypatch):
    """Run the sdpa blockwise path with unmerged chunks, small merged steps and its default."""
    min_tokens, budget = request.param
    monkeypatch.setattr(backend_sdpa, "MIN_STEP_TOKENS", min_tokens)
    if budget:
        monkeypatch.setattr(blockwise, "GATHER_BUDGET", budget)


def _check(out: torch.Tensor, expected: torch.Tensor) -> None:
    assert out.dtype == torch.float32 and out.shape == expected.shape
    err = (out.double() - expected).abs().max().item()
    assert err <= ATOL, f"max abs error {err:.2e} > {ATOL:.0e}"


@pytest.mark.parametrize(("name", "pattern", "q_len", "kv_len"), CASES, ids=CASE_IDS)
def test_sdpa_dense_matches_reference(name, pattern, q_len, kv_len, make_qkv, reference):
    q, k, v = make_qkv(2, q_len, kv_len)
    _check(backend_sdpa.sdpa_attention(q, k, v, pattern, mode="dense"), reference(q, k, v, pattern))


@pytest.mark.parametrize(("name", "pattern", "q_len", "kv_len"), BLOCK_CASES, ids=[c[0] for c in BLOCK_CASES])
def test_sdpa_blockwise_matches_reference(name, pattern, q_len, kv_len, step_sizes, make_qkv, reference):
    q, k, v = make_qkv(2, q_len, kv_len)
    _check(backend_sdpa.sdpa_attention(q, k, v, pattern, mode="blockwise"), reference(q, k, v, pattern))


@pytest.mark.parametrize(("name", "pattern", "q_len", "kv_len"), CASES, ids=CASE_IDS)
def test_flex_eager_matches_reference(name, pattern, q_len, kv_len, make_qkv, reference):
    q, k, v = make_qkv(1, q_len, kv_len)
    _check(dispatch_attention(q, k, v, pattern=pattern, backend="flex"), reference(q, k, v, pattern))


@pytest.mark.slow
def test_flex_compiled_matches_reference(monkeypatch, make_qkv, reference):
    monkeypatch.setenv("VIDGEN_FLEX_COMPILE", "1")
    for _, pattern, q_len, kv_len in CASES[-4:]:
        q, k, v = make_qkv(1, q_len, kv_len, dim=16)
        out = dispatch_attention(q, k, v, pattern=pattern, backend="flex")
        _check(out, reference(q, k, v, pattern))
    assert backend_flex._compiled_fn is not None and not backend_flex._compile_failed


@pytest.mark.slow
def test_flex_compiled_radial_matches_reference(monkeypatch, make_qkv, reference):
    # the compiled kernel evaluates mask_mod with the frame times captured as a tensor
    monkeypatch.setenv("VIDGEN_FLEX_COMPILE", "1")
    for _, pattern, q_len, kv_len in [c for c in CASES if c[0].startswith("radial")]:
        q, k, v = make_qkv(1, q_len, kv_len, dim=16)
        _check(dispatch_attention(q, k, v, pattern=pattern, backend="flex"), reference(q, k, v, pattern))
    assert not backend_flex._compile_failed


@pytest.mark.parametrize(
    "pattern",
    [
        AttentionPattern.block_causal(5, 2),
        AttentionPattern.sliding_window(3, 2, 4, sink_frames=2),
        AttentionPattern.sliding_window(2, 1, 3, sink_frames=1),
    ],
    ids=["block-causal", "window-sinks", "window-small-chunks"],
)
@pytest.mark.parametrize(("q_len", "kv_len"), [(47, 47), (13, 47)])
def test_sdpa_dense_and_blockwise_gradients_match_reference(
    pattern, q_len, kv_len, step_sizes, make_qkv, reference
):
    q, k, v = (t.requires_grad_() for t in make_qkv(2, q_len, kv_len, seed=3))
    grad_out = torch.randn(2, q_len, 2, 8, generator=torch.Generator().manual_seed(4))
    expected = torch.autograd.grad(reference(q, k, v, pattern), (q, k, v), grad_out.double())
    for mode in ("dense", "blockwise"):
        out = backend_sdpa.sdpa_attention(q, k, v, pattern, mode=mode)
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        for name, got, want in zip("qkv", grads, expected, strict=True):
            err = (got.double() - want).abs().max().item()
            assert err <= ATOL, f"{mode} d{name}: max abs error {err:.2e}"


def test_sdpa_picks_blockwise_by_size_and_both_paths_agree(make_qkv):
    pattern = AttentionPattern.sliding_window(64, 1, 2, sink_frames=1)
    assert not backend_sdpa.uses_blockwise(pattern, 512, 512)  # 0.25M pairs: dense
    assert backend_sdpa.uses_blockwise(pattern, 1024, 1024)
    assert not backend_sdpa.uses_blockwise(pattern, 32, 1 << 16)  # one chunk of queries: one call anyway
    assert not backend_sdpa.uses_blockwise(AttentionPattern.full(), 2048, 2048)
    q, k, v = make_qkv(1, 1024, 1024, heads=1)
    auto = dispatch_attention(q, k, v, pattern=pattern, backend="sdpa")
    dense = backend_sdpa.sdpa_attention(q, k, v, pattern, mode="dense")
    torch.testing.assert_close(auto, dense, atol=ATOL, rtol=0)


def test_merged_steps_carry_masks_and_stay_exact(make_qkv, reference):
    # one-token chunks merged into steps of 8 queries: each step needs its own mask
    pattern = AttentionPattern.sliding_window(1, 1, 3, sink_frames=2)
    steps = plan_steps(pattern, 30, 30, min_query_tokens=8)
    assert [s.num_queries for s in steps] == [8, 8, 8, 6]
    assert all(s.mask is not None and s.mask.shape == (s.num_queries, s.num_keys) for s in steps)
    assert max(s.num_keys for s in steps) <= 2 + 3 + 8  # sinks + window + the step itself: no full rows
    calls = plan_blockwise(pattern, 30, 30, min_query_tokens=8)
    assert [len(c.steps) for c in calls] == [1, 2, 1]  # steps 2 and 3 have the same shape and mask
    q, k, v = make_qkv(1, 30, 30)
    out = run_blockwise(q, k, v, calls, lambda qs, ks, vs, m: backend_sdpa._sdpa(qs, ks, vs, m, None))
    _check(out, reference(q, k, v, pattern))


def test_same_shaped_chunks_run_as_one_batched_call(monkeypatch, make_qkv, reference):
    pattern = AttentionPattern.sliding_window(4, 1, 2, sink_frames=1)
    calls = plan_blockwise(pattern, 64, 64)
    # chunks 0-2 see 4, 8, 12 keys; from chunk 3 on every chunk sees sink + window + itself = 16
    assert [len(c.steps) for c in calls] == [1, 1, 1, 13]
    assert all(s.mask is None for c in calls for s in c.steps)
    assert calls[-1].key_index.shape == (13, 16) and calls[-1].key_index[-1, :4].tolist() == [0, 1, 2, 3]
    monkeypatch.setattr(blockwise, "GATHER_BUDGET", 3 * 2 * 16 * 2 * 8)  # 3 steps per call at B=2, H=2, D=8
    seen = []

    def kernel(qs, ks, vs, mask):
        seen.append(qs.shape[0])
        return backend_sdpa._sdpa(qs, ks, vs, mask, None)

    q, k, v = make_qkv(2, 64, 64)
    _check(run_blockwise(q, k, v, calls, kernel), reference(q, k, v, pattern))
    assert seen == [2, 2, 2, 6, 6, 6, 6, 2]  # batch 2 x (1, 1, 1, then 3 + 3 + 3 + 3 + 1 steps)


def test_scale_is_applied(make_qkv, reference):
    pattern = AttentionPattern.sliding_window(4, 1, 2)
    q, k, v = make_qkv(1, 24, 24)
    expected = reference(q, k, v, pattern, scale=0.05)
    for backend in ("sdpa", "flex"):
        _check(dispatch_attention(q, k, v, pattern=pattern, backend=backend, scale=0.05), expected)


@pytest.mark.parametrize(
    ("pattern", "q_len", "kv_len"),
    [
        (AttentionPattern.block_causal(50, 1), 300, 300),
        (AttentionPattern.sliding_window(40, 2, 2, sink_frames=2), 200, 700),
        (AttentionPattern.sliding_window(128, 1, 1), 384, 384),  # whole-block chunks: full blocks appear
        (
            AttentionPattern.radial(
                (6, 25), range(6), chunk_frames=2, sink_frames=2, band_rows=1, tile_rows=2
            ),
            300,
            900,
        ),
    ],
)
def test_flex_block_mask_matches_create_block_mask(pattern, q_len, kv_len):
    from torch.nn.attention.flex_attention import create_block_mask

    ours = backend_flex.build_block_mask(pattern, q_len, kv_len, "cpu")
    theirs = create_block_mask(pattern.mask_mod_for(q_len, kv_len), None, None, q_len, kv_len, device="cpu")
    assert torch.equal(ours.to_dense(), theirs.to_dense())  # same blocks visited
    dense = pattern.dense_mask(q_len, kv_len)
    # a block we call "full" must really be fully visible (the kernel skips the mask there)
    full = torch.zeros_like(ours.to_dense()[0, 0], dtype=torch.bool)
    for qb in range(full.shape[0]):
        for i in range(ours.full_kv_num_blocks[0, 0, qb]):
            full[qb, ours.full_kv_indices[0, 0, qb, i]] = True
    for qb, kb in full.nonzero().tolist():
        assert dense[qb * 128 : (qb + 1) * 128, kb * 128 : (kb + 1) * 128].all()
    if pattern.chunk_tokens == 128:
        assert full.any()


def test_flex_refuses_grad_on_cpu(make_qkv):
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 16, 16))
    with pytest.raises(RuntimeError, match="no backward on CPU; use backend 'sdpa' for training"):
        backend_flex.flex_attention(q, k, v, AttentionPattern.block_causal(4))
    with torch.no_grad():  # inference on the same tensors is fine
        backend_flex.flex_attention(q, k, v, AttentionPattern.block_causal(4))


def test_compiled_forms_are_cached(make_qkv):
    pattern = AttentionPattern.sliding_window(8, 1, 2, sink_frames=1)
    first = backend_sdpa.dense_mask(pattern, 40, 40, torch.device("cpu"))
    assert backend_sdpa.dense_mask(pattern, 40, 40, torch.device("cpu")) is first
    assert backend_sdpa.dense_mask(pattern, 41, 41, torch.device("cpu")) is not first
    mask = backend_flex.block_mask(pattern, 40, 40, torch.device("cpu"))
    assert backend_flex.block_mask(pattern, 40, 40, torch.device("cpu")) is mask


def test_lru_cache_is_bounded_and_evicts_least_recent():
    cache: LRUCache[int] = LRUCache(maxsize=2)
    calls = []

    def make(x):
        calls.append(x)
        return x

    cache.get_or_create("a", lambda: make(1))
    cache.get_or_create("b", lambda: make(2))
    cache.get_or_create("a", lambda: make(-1))  # hit: "a" becomes most recent
    cache.get_or_create("c", lambda: make(3))  # evicts "b"
    assert calls == [1, 2, 3] and len(cache) == 2
    assert "a" in cache and "b" not in cache and "c" in cache


@st.composite
def patterns_and_lengths(draw):
    kind = draw(st.sampled_from(["block_causal", "sliding_window"]))
    chunk_frames = draw(st.integers(1, 3))
    pattern = AttentionPattern(
        kind=kind,
        frame_tokens=draw(st.integers(1, 5)),
        chunk_frames=chunk_frames,
        window_frames=draw(st.integers(0, 3)) * chunk_frames if kind == "sliding_window" else 0,
        sink_frames=draw(st.integers(0, 2)) * chunk_frames if kind == "sliding_window" else 0,
    )
    kv_len = draw(st.integers(1, 70))
    return pattern, draw(st.integers(1, kv_len)), kv_len


# the fixtures only hand out pure functions, so sharing them across examples is safe
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=patterns_and_lengths(), seed=st.integers(0, 2**16))
def test_random_patterns_match_reference(case, seed, make_qkv, reference):
    pattern, q_len, kv_len = case
    q, k, v = make_qkv(1, q_len, kv_len, seed=seed)
    expected = reference(q, k, v, pattern)
    _check(backend_sdpa.sdpa_attention(q, k, v, pattern, mode="dense"), expected)
    if pattern.is_block_structured:
        _check(backend_sdpa.sdpa_attention(q, k, v, pattern, mode="blockwise"), expected)
    _check(backend_flex.flex_attention(q, k, v, pattern), expected)


# --------------------------------------------------------------------------- GPU-only backends
def _gpu_backend_ready(module: str) -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec(module) is not None


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_backend_ready("flash_attn"), reason="needs CUDA and flash-attn")
@pytest.mark.parametrize(("name", "pattern", "q_len", "kv_len"), CASES)
def test_flash_matches_reference(name, pattern, q_len, kv_len, make_qkv, reference):
    q, k, v = (t.cuda().half() for t in make_qkv(1, q_len, kv_len, dim=64))
    out = dispatch_attention(q, k, v, pattern=pattern, backend="flash")
    torch.testing.assert_close(out.double(), reference(q, k, v, pattern), atol=2e-3, rtol=0)  # fp16


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_backend_ready("flash_attn"), reason="needs CUDA and flash-attn")
def test_flash_native_windows_and_kvcache(make_qkv, reference):
    from vidgen.attention.backend_flash import flash_attention_with_kvcache

    for pattern in (AttentionPattern.block_causal(1), AttentionPattern.sliding_window(1, 1, 5)):
        q, k, v = (t.cuda().half() for t in make_qkv(1, 9, 40, dim=64))
        out = dispatch_attention(q, k, v, pattern=pattern, backend="flash")
        torch.testing.assert_close(out.double(), reference(q, k, v, pattern), atol=2e-3, rtol=0)
    pattern = AttentionPattern.block_causal(8, 1)
    q, k, v = (t.cuda().half() for t in make_qkv(1, 8, 40, dim=64))
    k_cache = torch.zeros(1, 64, 2, 64, device="cuda", dtype=torch.half)  # (B, S_max, H, D)
    v_cache = torch.zeros_like(k_cache)
    k_cache[:, :32], v_cache[:, :32] = k[:, :32], v[:, :32]
    seqlens = torch.tensor([32], dtype=torch.int32, device="cuda")
    out = flash_attention_with_kvcache(
        q, k_cache, v_cache, seqlens, k_new=k[:, 32:], v_new=v[:, 32:], pattern=pattern
    )
    torch.testing.assert_close(out.double(), reference(q, k, v, pattern), atol=2e-3, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_backend_ready("xformers"), reason="needs CUDA and xformers")
@pytest.mark.parametrize(("name", "pattern", "q_len", "kv_len"), CASES, ids=CASE_IDS)
def test_xformers_matches_reference(name, pattern, q_len, kv_len, make_qkv, reference):
    q, k, v = (t.cuda() for t in make_qkv(1, q_len, kv_len, dim=64))
    out = dispatch_attention(q, k, v, pattern=pattern, backend="xformers")
    torch.testing.assert_close(out.double(), reference(q, k, v, pattern), atol=1e-4, rtol=0)


RADIAL_CASES = [c for c in CASES if c[1].kind.value == "radial"]


@pytest.mark.parametrize(
    ("name", "pattern", "q_len", "kv_len"), RADIAL_CASES, ids=[c[0] for c in RADIAL_CASES]
)
def test_sdpa_rectangles_match_reference(name, pattern, q_len, kv_len, make_qkv, reference):
    # the rectangles tile the mask exactly once, and merging their log-sum-exps gives the softmax
    covered = torch.zeros(q_len, kv_len, dtype=torch.int32)
    for q0, q1, k0, k1 in blockwise.plan_rectangles(pattern, q_len, kv_len):
        covered[q0:q1, k0:k1] += 1
    assert torch.equal(covered, pattern.dense_mask(q_len, kv_len).int())
    q, k, v = make_qkv(2, q_len, kv_len)
    with torch.no_grad():
        _check(backend_sdpa.sdpa_attention(q, k, v, pattern, mode="rectangles"), reference(q, k, v, pattern))


def test_sdpa_picks_rectangles_for_radial_inference_only(make_qkv):
    pattern = AttentionPattern.radial((20, 20), range(6), chunk_frames=2, sink_frames=2)
    q, k, v = make_qkv(1, 800, 2400)  # 1.9M pairs: past BLOCKWISE_MIN_PAIRS
    assert backend_sdpa.uses_rectangles(pattern, q, k, v)
    assert not backend_sdpa.uses_rectangles(AttentionPattern.sliding_window(40, 1, 2), q, k, v)
    q.requires_grad_()
    assert not backend_sdpa.uses_rectangles(pattern, q, k, v)  # training: blockwise has a backward
