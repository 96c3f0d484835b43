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
