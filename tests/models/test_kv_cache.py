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
