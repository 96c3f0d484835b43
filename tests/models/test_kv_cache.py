"""KVCache: ring-buffer bookkeeping, fixed memory, clone and safetensors round trip."""

import pytest
import torch

from vidgen.models import KVCache


def _cache(**kw):
    args = dict(
        num_layers=2, batch_size=1, num_heads=2, head_dim=4, frame_tokens=3, sink_frames=2, window_frames=4
    )
    args.update(kw)
    return KVCache(**args)


def _write_frames(cache, first, count, fill):
    for layer in range(cache.num_layers):
        k = torch.full((1, count * cache.frame_tokens, 2, 4), float(fill + layer))
        cache.write(layer, k, -k, first)
    cache.commit(first, count)


def test_ring_keeps_sinks_and_the_last_window_frames():
    cache = _cache()
    for chunk in range(6):
        _write_frames(cache, 2 * chunk, 2, fill=chunk)
    # frames 0-1 are sinks, the ring holds the newest four frames (8..11)
    assert sorted(cache.cached_frames) == [0, 1, 8, 9, 10, 11]
    k, v = cache.view(0)
    assert k.shape == (1, 6 * 3, 2, 4)
    by_frame = dict(zip(cache.cached_frames, k[0, ::3, 0, 0].tolist()))
    assert by_frame == {0: 0.0, 1: 0.0, 8: 4.0, 9: 4.0, 10: 5.0, 11: 5.0}
    assert torch.equal(v, -k)


def test_memory_is_fixed_whatever_the_length():
    cache = _cache()
    before = cache.k.numel() + cache.v.numel()
    for chunk in range(500):
        _write_frames(cache, 2 * chunk, 2, fill=0)
    assert cache.k.numel() + cache.v.numel() == before
    assert cache.num_cached_frames == 6


def test_partial_view_while_filling_and_after_reset():
    cache = _cache()
    _write_frames(cache, 0, 2, fill=1)
    assert cache.view(1)[0].shape[1] == 2 * 3
    _write_frames(cache, 2, 1, fill=2)
    assert cache.view(1)[0].shape[1] == 3 * 3
    cache.reset()
    assert cache.view(0)[0].shape[1] == 0 and cache.next_frame == 0


def test_writes_wrapping_around_the_ring_use_index_copy():
    cache = _cache(window_frames=3)  # chunks of 2 frames do not divide the ring
    for chunk in range(4):
        _write_frames(cache, 2 * chunk, 2, fill=chunk)
    assert sorted(cache.cached_frames) == [0, 1, 5, 6, 7]
    by_frame = dict(zip(cache.cached_frames, cache.view(0)[0][0, ::3, 0, 0].tolist()))
    assert by_frame == {0: 0.0, 1: 0.0, 5: 2.0, 6: 3.0, 7: 3.0}


def test_clone_is_independent():
    cache = _cache()
    _write_frames(cache, 0, 2, fill=1)
    copy = cache.clone()
    _write_frames(cache, 2, 2, fill=9)
    assert copy.cached_frames == [0, 1]
    assert copy.k[0, 0, 0, 0, 0] == 1.0


def test_save_and_load_round_trip(tmp_path):
    cache = _cache()
    for chunk in range(5):
        _write_frames(cache, 2 * chunk, 2, fill=chunk)
    path = tmp_path / "session.safetensors"
    cache.save(path, extra={"latents": torch.arange(6.0)})
    loaded, extra = KVCache.load(path)
    assert loaded.slot_frames == cache.slot_frames
    assert torch.equal(loaded.k, cache.k) and torch.equal(loaded.v, cache.v)
    assert torch.equal(extra["latents"], torch.arange(6.0))


def test_load_rejects_missing_and_foreign_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        KVCache.load(tmp_path / "nope.safetensors")
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not a vidgen KV cache"):
        KVCache.load(tmp_path / "other.safetensors")


def test_invalid_geometry():
    with pytest.raises(ValueError, match="at least one slot"):
        _cache(sink_frames=0, window_frames=0)


def test_workspace_attends_like_the_view_and_rotates_once_per_chunk():
    # a sampler's calls per chunk (3 steps, then the cache write), a ring that wraps, and a re-cache
    # with other values (same frames, so only the version tells the workspace it is stale): the
    # workspace path must give bit-identical outputs and rebuild its prefix once per chunk
    from tests.models.conftest import TINY
    from vidgen.models import CausalWanTransformer

    torch.manual_seed(0)
    model = CausalWanTransformer(**TINY).eval()
    text = torch.randn(1, 5, TINY["text_dim"])
    caches = {
        use: model.make_kv_cache(
            batch_size=1, latent_height=4, latent_width=6, sink_frames=1, window_frames=2
        )
        for use in (True, False)
    }
    for use, cache in caches.items():
        cache.use_workspace = use
    outputs = {True: [], False: []}
    chunks = 0
    with torch.no_grad():
        for offset in range(0, 6):  # chunks of one frame: the ring wraps from frame 3 on
            chunks += 1
            x = torch.randn(1, 4, 1, 4, 6)
            for step in range(4):
                for use, cache in caches.items():
                    out = model(x, torch.tensor([900.0 - 200 * step]), text, kv_cache=cache,
                                frame_offset=offset, update_cache=step == 3, rope_mode="rolling",
                                return_dict=False)[0]  # fmt: skip
                    outputs[use].append(out)
        for use, cache in caches.items():  # re-cache: same frames, new values
            frames = cache.cached_frames
            cache.reset()
            for frame in frames:
                model(torch.randn(1, 4, 1, 4, 6, generator=torch.Generator().manual_seed(frame)),
                      torch.tensor([0.0]), text, kv_cache=cache, frame_offset=frame, update_cache=True,
                      rope_mode="rolling")  # fmt: skip
            x = torch.randn(1, 4, 1, 4, 6, generator=torch.Generator().manual_seed(99))
            out = model(x, torch.tensor([500.0]), text, kv_cache=cache, frame_offset=6, rope_mode="rolling")
            outputs[use].append(out.sample)
    for a, b in zip(outputs[True], outputs[False], strict=True):
        assert torch.equal(a, b)
    # once per chunk (4 calls each), once per re-cache write (3 frames), once for the last call
    assert caches[True].workspace_refreshes == chunks + 3 + 1
    assert caches[False].workspace_refreshes == 0


def _identity_rope(cache: KVCache) -> torch.Tensor:
    tokens = cache.num_cached_frames * cache.frame_tokens
    return _identity_rotation(tokens)


def _identity_rotation(tokens: int) -> torch.Tensor:
    """(cos, sin) = (1, 0) for each of the two channel pairs of head_dim 4."""
    return torch.stack((torch.ones(1, tokens, 1, 2), torch.zeros(1, tokens, 1, 2)), dim=-1)


@pytest.mark.parametrize(
    ("sinks", "window", "slots"),
    [
        (2, 3, [0, 1, 2, 3, 4, 2, 3, 4, 2]),  # the ring turns every 3 frames after the sinks
        (0, 3, [0, 1, 2, 0, 1, 2, 0, 1, 2]),
        (1, 1, [0, 1, 1, 1, 1, 1, 1, 1, 1]),
        (2, 0, [0, 1, None, None, None, None, None, None, None]),  # sinks only: later frames kept nowhere
    ],
)
def test_slot_of_each_frame(sinks, window, slots):
    cache = _cache(sink_frames=sinks, window_frames=window)
    assert [cache.slot_of(f) for f in range(9)] == slots
    _write_frames(cache, 0, 9, fill=0)
    kept = {f for f in range(9) if f < sinks or f >= 9 - window}
    assert cache.frames_kept(range(9)) == kept
    assert set(cache.cached_frames) == kept
    assert cache.next_frame == (8 if window else sinks - 1) + 1


def test_geometry_bounds():
    for sinks, window in ((0, 3), (2, 0), (3, 3), (1, 1)):
        assert _cache(sink_frames=sinks, window_frames=window).capacity_frames == sinks + window
    for sinks, window in ((-1, 3), (2, -1), (0, 0)):
        with pytest.raises(ValueError, match="sink_frames >= 0"):
            _cache(sink_frames=sinks, window_frames=window)


def test_an_empty_cache_starts_at_frame_zero_and_the_newest_frame_sets_the_next():
    cache = _cache()
    assert cache.next_frame == 0 and cache.cached_frames == []
    for chunk in range(6):
        _write_frames(cache, 2 * chunk, 2, fill=chunk)
    assert cache.next_frame == 12  # frames 0-1 and 8-11 held


def test_reset_keeping_the_sinks_then_refilling_out_of_order():
    """After a reset that keeps the sinks, a frame written to the ring's second slot leaves a gap:
    the view must pick the held slots, not a prefix."""
    cache = _cache()
    for chunk in range(3):
        _write_frames(cache, 2 * chunk, 2, fill=chunk)
    cache.reset(keep_sinks=True)
    assert cache.cached_frames == [0, 1]
    _write_frames(cache, 7, 1, fill=7)  # slot 2 + (7 - 2) % 4 = 3
    assert cache.cached_frames == [0, 1, 7]
    k, v = cache.view(1)
    assert k[0, ::3, 0, 0].tolist() == [1.0, 1.0, 8.0]  # fill + layer
    assert torch.equal(v, -k)
    assert cache.frame_index().tolist() == [0, 1, 7]


def test_wrapping_writes_store_values_too():
    cache = _cache(window_frames=3)
    for chunk in range(4):
        _write_frames(cache, 2 * chunk, 2, fill=chunk)
    assert cache.slot_frames == [0, 1, 5, 6, 7]
    for layer in range(2):
        k, v = cache.view(layer)
        assert torch.equal(v, -k)
        assert k[0, ::3, 0, 0].tolist() == [layer + x for x in (0.0, 0.0, 2.0, 3.0, 3.0)]


def test_the_frame_index_lives_on_the_caches_device():
    cache = _cache(device="meta")
    assert cache.frame_index().device.type == "meta"


def test_the_cache_is_not_part_of_a_state_dict():
    """A model holding a cache saves its weights only, and so does a clone."""
    cache = _cache()
    assert list(cache.state_dict()) == []
    assert list(cache.clone().state_dict()) == []


def test_a_clone_works_on_its_own():
    cache = _cache()
    _write_frames(cache, 0, 2, fill=1)
    copy = cache.clone()
    assert copy.use_workspace and copy.window_frames == 4
    _write_frames(copy, 2, 2, fill=5)
    assert copy.cached_frames == [0, 1, 2, 3] and cache.cached_frames == [0, 1]
    k, v = copy.view(0)
    assert k[0, ::3, 0, 0].tolist() == [1.0, 1.0, 5.0, 5.0] and torch.equal(v, -k)
    keys, values, held = copy.workspace(_identity_rope(copy), None, 3, torch.float32)
    assert held == 12 and torch.equal(keys[0, :, :held], k)


def test_the_workspace_is_rebuilt_when_the_held_frames_change_and_allocated_once():
    """Re-caching the same frames with new values must not reuse the stale prefix; the buffers are
    sized for a full cache at once, so their storage stays put while the cache fills."""
    cache = _cache()
    assert cache.use_workspace  # the default
    _write_frames(cache, 0, 2, fill=1)
    keys, _, held = cache.workspace(_identity_rope(cache), None, 3, torch.float32)
    storage = keys.data_ptr()
    assert keys[0, 0, 0, 0, 0] == 1.0
    cache.reset()
    _write_frames(cache, 0, 2, fill=7)
    keys, values, held = cache.workspace(_identity_rope(cache), None, 3, torch.float32)
    assert keys[0, 0, 0, 0, 0] == 7.0 and values[0, 0, 0, 0, 0] == -7.0
    for chunk in range(1, 6):  # fill the cache and wrap the ring
        _write_frames(cache, 2 * chunk, 2, fill=chunk)
        keys, _, held = cache.workspace(_identity_rope(cache), None, 3, torch.float32)
        assert keys.data_ptr() == storage
    assert held == 6 * 3 and keys.shape[2] == held + 3


def test_sinks_only_shows_the_sinks_then_holds_the_new_frames_beside_the_window():
    """Inside ``sinks_only`` attention sees the sink frames alone; a chunk written there takes its
    ring slots, and the window frames it did not replace come back with their values."""
    cache = _cache()
    for chunk in range(3):  # sinks 0-1, window 2-5
        _write_frames(cache, 2 * chunk, 2, fill=10 * chunk)
    version = cache.version
    with cache.sinks_only():
        assert cache.cached_frames == [0, 1] and cache.frame_index().tolist() == [0, 1]
        k, _ = cache.view(0)
        assert k.shape[1] == 2 * 3 and k.unique().tolist() == [0.0]  # the sinks' keys only
        assert cache.version > version  # a workspace built before is stale
        _write_frames(cache, 6, 2, fill=30)  # frames 6-7 take the slots of frames 2-3
    assert sorted(cache.cached_frames) == [0, 1, 4, 5, 6, 7]
    by_frame = dict(zip(cache.cached_frames, cache.view(0)[0][0, ::3, 0, 0].tolist()))
    assert by_frame == {0: 0.0, 1: 0.0, 4: 20.0, 5: 20.0, 6: 30.0, 7: 30.0}
    with pytest.raises(RuntimeError), cache.sinks_only():  # an error inside restores the window too
        raise RuntimeError
    assert sorted(cache.cached_frames) == [0, 1, 4, 5, 6, 7]


def test_sinks_only_without_sinks_holds_frame_zero_written_inside():
    cache = _cache(sink_frames=0)
    with cache.sinks_only():
        assert cache.cached_frames == []
        _write_frames(cache, 0, 2, fill=1)
    assert cache.cached_frames == [0, 1]


def test_a_workspace_built_inside_sinks_only_is_not_reused_after_it():
    """Leaving ``sinks_only`` changes what attention sees: the rotated workspace is rebuilt."""
    cache = _cache()
    for chunk in range(3):
        _write_frames(cache, 2 * chunk, 2, fill=10 * chunk)

    def identity(frames):
        return _identity_rotation(frames * cache.frame_tokens)

    with cache.sinks_only():
        _, _, held = cache.workspace(identity(2), "stamp", 3, torch.float32)
        assert held == 2 * 3
        _write_frames(cache, 6, 2, fill=30)  # a chunk written against the sinks, committed
    keys, _, held = cache.workspace(identity(6), "stamp", 3, torch.float32)
    assert held == 6 * 3
    assert sorted(keys[0, 0, :held:3, 0, 0].tolist()) == [0.0, 0.0, 20.0, 20.0, 30.0, 30.0]
