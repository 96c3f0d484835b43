"""Batched chunk steps (vidgen.pipelines.batching): several calls as one forward give each call the
tensor it gets alone; sessions stepped together make the frames they make alone; one session's
failing call fails only that session."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from tests.tiny import FP32, tiny_components
from vidgen.models import CausalWanTransformer
from vidgen.pipelines.batching import StepBatcher, batch_key
from vidgen.pipelines.session import GenerationRequest, SessionManager

TINY = dict(
    patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
    text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, rope_max_seq_len=64,
)  # fmt: skip
VARIANT = {"spatial_pos_grid": (3, 4), "text_modulation": True, "text_velocity": True}


def _model(variant: bool) -> CausalWanTransformer:
    torch.manual_seed(0)
    model = CausalWanTransformer(**TINY, **(VARIANT if variant else {})).eval()
    if variant:  # the additions on, not at their zero start
        with torch.no_grad():
            for p in (model.spatial_pos, model.velocity_gain, *model.text_to_modulation.parameters()):
                p.normal_(0, 0.1)
    return model


def _call(model, seed: int, batch: int, filled: int, per_frame: bool, update: bool, rope: str) -> dict:
    """A call against a cache holding ``filled`` chunks of 2 latent frames (sinks 2, window 4)."""
    g = torch.Generator().manual_seed(seed)
    cache = model.make_kv_cache(
        batch_size=batch, latent_height=6, latent_width=8, sink_frames=2, window_frames=4
    )
    with torch.no_grad():
        text = model.encode_text(torch.randn(batch, 5, 32, generator=g))
        for chunk in range(filled):
            model(
                torch.randn(batch, 4, 2, 6, 8, generator=g),
                torch.zeros(batch),
                text_context=text,
                kv_cache=cache,
                frame_offset=2 * chunk,
                update_cache=True,
                rope_mode=rope,
            )
    timestep = (
        torch.rand(batch, 2, generator=g) * 1000 if per_frame else torch.rand(batch, generator=g) * 1000
    )
    return dict(
        hidden_states=torch.randn(batch, 4, 2, 6, 8, generator=g),
        timestep=timestep,
        text_context=text,
        kv_cache=cache,
        frame_offset=2 * filled,
        update_cache=update,
        rope_mode=rope,
    )


@pytest.mark.parametrize("variant", [False, True], ids=["wan", "default-model-variant"])
@pytest.mark.parametrize("per_frame", [False, True], ids=["per-sample-t", "per-frame-t"])
def test_a_batched_forward_gives_each_call_its_own_output_bit_for_bit(variant, per_frame):
    """Calls at different fill levels of their caches (0 to 4 chunks: positions, window and sinks
    differ), batch sizes 1 and 2 (guidance), absolute and rolling positions, writing their caches or
    not: each call's output and cache are those of its call alone."""
    model = _model(variant)
    specs = [(1, 0, "absolute"), (2, 1, "rolling"), (1, 3, "rolling"), (1, 4, "absolute")]
    for update in (False, True):
        alone = [_call(model, s, b, f, per_frame, update, r) for s, (b, f, r) in enumerate(specs)]
        together = [_call(model, s, b, f, per_frame, update, r) for s, (b, f, r) in enumerate(specs)]
        with torch.no_grad():
            expected = [model(**c, return_dict=False)[0] for c in alone]
            got = model.forward_many(together)
        for index, (a, b, e, o) in enumerate(zip(alone, together, expected, got)):
            assert torch.equal(o, e), (update, index, (o - e).abs().max())
            assert torch.equal(a["kv_cache"].k, b["kv_cache"].k) and torch.equal(
                a["kv_cache"].v, b["kv_cache"].v
            )
            assert a["kv_cache"].slot_frames == b["kv_cache"].slot_frames
        # the calls differ: a batch that handed one call's attention to another would not match
        assert not torch.equal(expected[2], expected[3])


def test_calls_that_cannot_share_a_forward_have_different_keys():
    model = _model(False)
    a, b = _call(model, 0, 1, 1, False, False, "rolling"), _call(model, 1, 2, 2, False, True, "absolute")
    assert batch_key(model, a) == batch_key(model, b)  # batch size, fill, positions, writing: shared
    per_frame = _call(model, 2, 1, 1, True, False, "rolling")
    assert batch_key(model, per_frame) != batch_key(model, a)
    bigger = dict(a, hidden_states=torch.randn(1, 4, 2, 8, 8))
    assert batch_key(model, bigger) != batch_key(model, a)
    with torch.enable_grad():
        assert batch_key(model, a) != batch_key(torch.nn.Module(), a)  # no forward_many: never batched
    assert batch_key(torch.nn.Identity(), a) is None


def _in_threads(batcher: StepBatcher, jobs):
    """Each job on its own member thread, all members before any calls (so that they share rounds)."""
    results: list = [None] * len(jobs)
    everyone_in = threading.Barrier(len(jobs))

    def run(index, job):
        with batcher.member():
            everyone_in.wait(30)
            try:
                results[index] = job()
            except Exception as err:  # noqa: BLE001 - compared below
                results[index] = err

    threads = [threading.Thread(target=run, args=item) for item in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads), "a member thread never returned"
    return results


def test_the_batcher_runs_waiting_calls_as_one_forward_and_an_error_stays_its_callers():
    model = _model(True)
    good = [_call(model, s, 1, s % 3, False, False, "rolling") for s in range(3)]
    with torch.no_grad():
        expected = [model(**c, return_dict=False)[0] for c in good]
    bad = dict(_call(model, 9, 1, 0, False, False, "absolute"), frame_offset=200)  # beyond the rope table
    batcher = StepBatcher(max_batch=8)

    def job(kwargs):
        with torch.no_grad():
            return batcher.call(model, dict(kwargs))

    results = _in_threads(batcher, [lambda c=c: job(c) for c in good] + [lambda: job(bad)])
    for got, want in zip(results, expected):
        assert torch.equal(got, want)
    assert isinstance(results[3], ValueError) and "rope_max_seq_len" in str(results[3])
    # all four waited for one round: one forward of four failed, then each ran alone
    assert batcher.stats.rounds == 1 and batcher.stats.sizes == {1: 3}

    batcher = StepBatcher(max_batch=8)
    results = _in_threads(batcher, [lambda c=c: job(c) for c in good])
    assert all(torch.equal(g, w) for g, w in zip(results, expected))
    assert batcher.stats.sizes == {3: 1}  # one forward carried the three calls

    batcher = StepBatcher(max_batch=2, lanes=1)
    _in_threads(batcher, [lambda c=c: job(c) for c in good])
    assert sorted(batcher.stats.sizes.items()) == [(1, 1), (2, 1)]  # at most two per forward


def test_a_lone_member_and_a_non_member_never_wait():
    model = _model(False)
    call = _call(model, 0, 1, 1, False, False, "rolling")
    batcher = StepBatcher()
    done = threading.Event()

    def alone():
        with batcher.member(), torch.no_grad():
            batcher.call(model, dict(call))
            batcher.call(model, dict(call))
        done.set()

    thread = threading.Thread(target=alone)
    thread.start()
    assert done.wait(30)
    thread.join()
    assert batcher.stats.rounds == 2 and batcher.stats.sizes == {1: 2}


def _frames(store: SessionManager, session_id: str) -> np.ndarray:
    return np.concatenate([c.frames for c in store.chunks(session_id)])


@pytest.mark.parametrize("lanes", [1, 2])
def test_sessions_stepped_together_make_the_frames_they_make_alone(lanes):
    """Three sessions (different prompts, seeds, one with guidance) read at once from their own
    threads, as the page's clients read: batched, every frame is the frame of the session alone."""
    pipe = tiny_components(**FP32)
    requests = [
        GenerationRequest(prompt="a red circle moving left", seconds=1.5, seed=1),
        GenerationRequest(prompt="a blue square drifting down", seconds=1.5, seed=2, guidance_scale=3.0),
        GenerationRequest(prompt="a green triangle", seconds=1.0, seed=3),
    ]
    alone = SessionManager(pipe)
    expected = [_frames(alone, alone.open(r)) for r in requests]

    store = SessionManager(pipe, batch_sessions=4)
    store.batcher.lanes = lanes
    ids = [store.open(r) for r in requests]
    got: dict[str, np.ndarray] = {}
    threads = [threading.Thread(target=lambda s=s: got.__setitem__(s, _frames(store, s))) for s in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for sid, want in zip(ids, expected):
        np.testing.assert_array_equal(got[sid], want)
    stats = store.describe()["batched"]
    assert max(stats["sizes"]) >= 2  # the sessions did share forwards
    assert stats["calls"] > stats["forwards"]
