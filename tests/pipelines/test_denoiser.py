"""The chunk denoiser on a tiny seeded transformer: guidance, the sampler loop, context writes and
attention patterns, each against the model called directly (float32, CPU)."""

import pytest
import torch

from tests.models.conftest import TINY
from vidgen.attention import AttentionPattern
from vidgen.models import CausalWanTransformer, KVCache, RopePositionMode
from vidgen.pipelines.denoiser import ChunkDenoiser, Conditioning, context_groups, write_held
from vidgen.pipelines.scheduler import FlowSchedule, add_noise

H = W = 4  # latent size: 2x2 tokens per frame


@pytest.fixture(scope="module")
def model() -> CausalWanTransformer:
    torch.manual_seed(0)
    return CausalWanTransformer(**TINY).eval()


def _text(model, seed: int, batch: int = 1):
    return model.encode_text(torch.randn(batch, 5, 16, generator=torch.Generator().manual_seed(seed)))


def _cache(model, batch: int = 1) -> KVCache:
    return model.make_kv_cache(
        batch_size=batch, latent_height=H, latent_width=W, sink_frames=1, window_frames=4
    )


def _latents(frames: int, seed: int = 1, batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, 4, frames, H, W, generator=torch.Generator().manual_seed(seed))


def _filled_cache(model, denoiser: ChunkDenoiser, batch: int = 1) -> KVCache:
    """A cache holding frames 0-3 written by ``denoiser`` (prompt 1), so later calls attend to context."""
    cache = _cache(model, batch)
    cond = (
        Conditioning(_text(model, 1), _text(model, 2), 3.0) if batch == 2 else Conditioning(_text(model, 1))
    )
    for offset in (0, 2):
        denoiser.write_context(_latents(2, 10 + offset), cond, cache, offset)
    return cache


def _direct(model, latents, sigma, text, cache, frame_offset, **kw):
    """The model's velocity at timestep 1000 sigma, called without the denoiser."""
    timestep = torch.full((latents.shape[0], latents.shape[2]), 1000.0 * sigma)
    kw.setdefault("rope_mode", RopePositionMode.ROLLING)
    return model(
        latents,
        timestep,
        text_context=text,
        kv_cache=cache,
        frame_offset=frame_offset,
        return_dict=False,
        **kw,
    )[0]


def test_context_groups_are_contiguous_runs_of_at_most_a_chunk():
    assert context_groups([9, 5, 1, 2, 3, 4, 8], 2) == [[1, 2], [3, 4], [5], [8, 9]]
    assert context_groups([0, 1, 2, 6, 7], 3) == [[0, 1, 2], [6, 7]]
    assert context_groups([], 2) == []


def test_guidance_needs_a_negative_context_and_a_scale_other_than_one(model):
    cond, uncond = _text(model, 1), _text(model, 2)
    assert not Conditioning(cond).guided
    assert not Conditioning(cond, uncond).guided  # the scale is 1 unless given
    assert not Conditioning(cond, uncond, 1.0).guided
    assert Conditioning(cond, uncond, 5.0).guided
    batched = Conditioning(cond, uncond, 5.0).batched()
    torch.testing.assert_close(batched.keys[0], torch.cat([cond.keys[0], uncond.keys[0]]))
    assert Conditioning(cond, uncond, 1.0).batched() is cond


def test_prediction_is_the_models_velocity_at_timestep_1000_sigma(model):
    denoiser = ChunkDenoiser(model, FlowSchedule(2), chunk_frames=2)
    cache = _filled_cache(model, denoiser)
    latents, text = _latents(2), _text(model, 1)
    got = denoiser.predict(latents, torch.full((1, 2), 0.6), Conditioning(text), cache, frame_offset=4)
    expected = _direct(model, latents, 0.6, text, cache, 4)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert cache.cached_frames == [0, 1, 2, 3]  # predicting writes nothing


@pytest.mark.parametrize("scale", [3.0, 0.5])
def test_guided_prediction_extrapolates_from_the_unconditional_branch(model, scale):
    """Both branches run batched against a cache of batch 2; the result must be
    ``uncond + scale * (cond - uncond)`` of the branches run one at a time."""
    denoiser = ChunkDenoiser(model, FlowSchedule(2), chunk_frames=2)
    cache = _filled_cache(model, denoiser, batch=2)
    cond, uncond = _text(model, 1), _text(model, 2)
    latents, sigmas = _latents(2), torch.full((1, 2), 0.6)
    got = denoiser.predict(latents, sigmas, Conditioning(cond, uncond, scale), cache, frame_offset=4)
    # the branches alone, each against its half of the batch-2 cache
    halves = []
    for b, text in enumerate((cond, uncond)):
        alone = _cache(model)
        alone.k.copy_(cache.k[:, b : b + 1])
        alone.v.copy_(cache.v[:, b : b + 1])
        alone.slot_frames = list(cache.slot_frames)
        halves.append(_direct(model, latents, 0.6, text, alone, 4))
    expected = halves[1] + scale * (halves[0] - halves[1])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert not torch.allclose(got, halves[0], atol=1e-3)


def test_guidance_for_a_batch_of_videos(model):
    """Three videos at once: the cache holds the three conditional rows, then the three
    unconditional ones, and each video gets its own guided velocity."""
    denoiser = ChunkDenoiser(model, FlowSchedule(2), chunk_frames=2)
    cond, uncond = _text(model, 1, batch=3), _text(model, 2, batch=3)
    latents, sigmas = _latents(2, batch=3), torch.full((3, 2), 0.6)
    got = denoiser.predict(latents, sigmas, Conditioning(cond, uncond, 4.0), _cache(model, 6), 0)
    c = _direct(model, latents, 0.6, cond, _cache(model, 3), 0)
    u = _direct(model, latents, 0.6, uncond, _cache(model, 3), 0)
    torch.testing.assert_close(got, u + 4.0 * (c - u), atol=1e-5, rtol=0)


def test_denoise_runs_the_euler_steps_from_the_schedule(model):
    """Every step moves by (sigma_next - sigma) * v of the model at that level; the callback sees it."""
    schedule = FlowSchedule(3, shift=2.0)
    denoiser = ChunkDenoiser(model, schedule, chunk_frames=2)
    cache = _filled_cache(model, denoiser)
    noise, text = _latents(2, seed=3), _text(model, 1)
    seen = []
    got = denoiser.denoise(
        noise, Conditioning(text), cache, 4, callback=lambda i, s, x: seen.append((i, s, x.clone()))
    )
    x = noise.clone()
    sigmas = schedule.sigmas
    for i in range(3):
        x = x + (sigmas[i + 1] - sigmas[i]) * _direct(model, x, sigmas[i], text, cache, 4)
        assert seen[i][:2] == (i, sigmas[i])
        torch.testing.assert_close(seen[i][2], x, atol=1e-5, rtol=0)
    assert len(seen) == 3
    torch.testing.assert_close(got, x, atol=1e-5, rtol=0)


def test_denoise_follows_the_planned_levels_with_x0_renoise(model):
    """Planned levels replace the schedule's; x0_renoise re-noises with the generator's noise."""
    schedule = FlowSchedule(2, sampler="x0_renoise")
    denoiser = ChunkDenoiser(model, schedule, chunk_frames=2)
    cache = _filled_cache(model, denoiser)
    noise, text = _latents(2, seed=3), _text(model, 1)
    levels = [0.9, 0.4, 0.0]
    got = denoiser.denoise(
        noise, Conditioning(text), cache, 4, torch.Generator().manual_seed(5), sigmas=levels
    )
    generator = torch.Generator().manual_seed(5)
    clean = noise - 0.9 * _direct(model, noise, 0.9, text, cache, 4)
    x = add_noise(clean, torch.randn(noise.shape, generator=generator), 0.4)
    expected = x - 0.4 * _direct(model, x, 0.4, text, cache, 4)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_a_clean_context_write_stores_the_chunk_at_sigma_zero_and_draws_no_noise(model):
    denoiser = ChunkDenoiser(model, FlowSchedule(2), chunk_frames=2)  # context_noise 0 by default
    clean, text = _latents(2, seed=4), _text(model, 1)
    generator = torch.Generator().manual_seed(9)
    state = generator.get_state()
    cache = _cache(model)
    denoiser.write_context(clean, Conditioning(text), cache, 0, generator)
    assert cache.cached_frames == [0, 1]
    assert torch.equal(generator.get_state(), state)
    reference = _cache(model)
    _direct(model, clean, 0.0, text, reference, 0, update_cache=True)
    torch.testing.assert_close(cache.k, reference.k, atol=1e-6, rtol=0)
    torch.testing.assert_close(cache.v, reference.v, atol=1e-6, rtol=0)


def test_a_noisy_context_write_stores_the_chunk_renoised_to_the_context_level(model):
    denoiser = ChunkDenoiser(model, FlowSchedule(2), context_noise=0.3, chunk_frames=2)
    clean, text = _latents(2, seed=4), _text(model, 1)
    cache = _cache(model)
    denoiser.write_context(clean, Conditioning(text), cache, 0, torch.Generator().manual_seed(9))
    noisy = add_noise(clean, torch.randn(clean.shape, generator=torch.Generator().manual_seed(9)), 0.3)
    reference = _cache(model)
    _direct(model, noisy, 0.3, text, reference, 0, update_cache=True)
    torch.testing.assert_close(cache.k, reference.k, atol=1e-6, rtol=0)
    clean_write = _cache(model)
    _direct(model, clean, 0.0, text, clean_write, 0, update_cache=True)
    assert not torch.allclose(cache.k, clean_write.k, atol=1e-3)


@pytest.mark.parametrize("chunk_frames", [1, 2])
def test_chunks_in_flight_do_not_see_later_chunks(model, chunk_frames):
    """Two chunks in one call: the first chunk's velocity is what it gets alone; the second one
    sees the first (block-causal), so it differs from the second alone."""
    kw = {"chunk_frames": chunk_frames} if chunk_frames != 1 else {}  # 1 is the default
    denoiser = ChunkDenoiser(model, FlowSchedule(2), **kw)
    cache = _filled_cache(model, ChunkDenoiser(model, FlowSchedule(2), chunk_frames=2))
    text = Conditioning(_text(model, 1))
    both = _latents(2 * chunk_frames, seed=6)
    sigmas = torch.full((1, 2 * chunk_frames), 0.5)
    together = denoiser.predict(both, sigmas, text, cache, 4)
    first = denoiser.predict(both[:, :, :chunk_frames], sigmas[:, :chunk_frames], text, cache, 4)
    torch.testing.assert_close(together[:, :, :chunk_frames], first, atol=1e-5, rtol=0)
    second = denoiser.predict(
        both[:, :, chunk_frames:], sigmas[:, chunk_frames:], text, cache, 4 + chunk_frames
    )
    assert not torch.allclose(together[:, :, chunk_frames:], second, atol=1e-4)
    dense = _direct(model, both, 0.5, text.cond, cache, 4)
    assert not torch.allclose(together[:, :, :chunk_frames], dense[:, :, :chunk_frames], atol=1e-4)


def test_radial_attention_is_built_from_the_cache_layout(model):
    denoiser = ChunkDenoiser(model, FlowSchedule(2), chunk_frames=2, attention="radial")
    cache = _filled_cache(model, denoiser)
    latents, text = _latents(2), _text(model, 1)
    got = denoiser.predict(latents, torch.full((1, 2), 0.5), Conditioning(text), cache, 4)
    expected = _direct(
        model,
        latents,
        0.5,
        text,
        cache,
        4,
        attention_pattern=AttentionPattern.radial(
            model.latent_grid(H, W),
            cache.cached_frames + [4, 5],
            chunk_frames=2,
            query_frames=2,
            sink_frames=1,
        ),
    )
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_autocast_only_when_asked(model):
    cache = _cache(model)
    latents, sigmas, text = _latents(2), torch.full((1, 2), 0.5), Conditioning(_text(model, 1))
    plain = ChunkDenoiser(model, FlowSchedule(2), chunk_frames=2).predict(latents, sigmas, text, cache, 0)
    torch.testing.assert_close(plain, _direct(model, latents, 0.5, text.cond, cache, 0), atol=1e-6, rtol=0)
    bf16 = ChunkDenoiser(model, FlowSchedule(2), chunk_frames=2, autocast=torch.bfloat16)
    low = bf16.predict(latents, sigmas, text, cache, 0)
    assert low.dtype == torch.float32
    assert not torch.allclose(low, plain, atol=1e-4)  # bf16 matmuls round differently
    torch.testing.assert_close(low, plain, atol=0.1, rtol=0.1)
    # the dtype asked for, not always bf16
    half = ChunkDenoiser(model, FlowSchedule(2), chunk_frames=2, autocast=torch.float16)
    with torch.autocast("cpu", dtype=torch.float16):
        expected = _direct(model, latents, 0.5, text.cond, cache, 0).float()
    torch.testing.assert_close(half.predict(latents, sigmas, text, cache, 0), expected, atol=1e-6, rtol=0)
    assert not torch.allclose(expected, low, atol=1e-4)


# --------------------------------------------------------------------------- the cache pass
class _Recording(ChunkDenoiser):
    """Records the first frame of every context write."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.writes: list[int] = []

    def write_context(self, clean, conditioning, cache, frame_offset, generator=None) -> None:
        self.writes.append(frame_offset)
        super().write_context(clean, conditioning, cache, frame_offset, generator)


def _sink_cache(model) -> KVCache:
    return model.make_kv_cache(batch_size=1, latent_height=H, latent_width=W, sink_frames=2, window_frames=4)


def _held(frames, seed: int = 20) -> dict[int, torch.Tensor]:
    return {f: _latents(1, seed + f) for f in frames}


def _slots(cache: KVCache, frames) -> list[int]:
    t = cache.frame_tokens
    return [cache.slot_of(f) * t + i for f in frames for i in range(t)]


def test_the_cache_pass_writes_what_is_new_and_keeps_what_is_written(model):
    denoiser = _Recording(model, FlowSchedule(2), chunk_frames=2)
    cache, cond, drawn = _sink_cache(model), Conditioning(_text(model, 1)), []
    written = write_held(denoiser, cache, _held(range(2)), cond, "a", {}, drawn.append)
    written = write_held(denoiser, cache, _held(range(4)), cond, "a", written, drawn.append)
    assert written == {(0, 1): "a", (2, 3): "a"} and denoiser.writes == [0, 2] and drawn == [0, 2]
    held = _held(range(6))
    written = write_held(denoiser, cache, held, cond, "a", written, drawn.append)
    assert denoiser.writes == [0, 2, 4] and sorted(cache.cached_frames) == list(range(6))
    keys = cache.k.clone()
    write_held(denoiser, cache, held, cond, "a", written, drawn.append, full=True)  # everything again ...
    assert denoiser.writes[3:] == [0, 2, 4] and torch.equal(cache.k, keys)  # ... to the same values
    write_held(denoiser, cache, held, Conditioning(_text(model, 2)), "b", written, drawn.append)
    assert denoiser.writes[6:] == [0, 2, 4] and not torch.allclose(cache.k, keys)  # a new prompt: all


def test_a_window_chunk_sees_the_sinks_and_itself_only(model):
    """Its keys are those of writing it right after the sinks, whatever the other window chunks hold."""
    denoiser = ChunkDenoiser(model, FlowSchedule(2), chunk_frames=2)
    cond = Conditioning(_text(model, 1))
    held = _held(range(6))
    cache = _sink_cache(model)
    write_held(denoiser, cache, held, cond, "a", {}, lambda frame: None)
    reference = _sink_cache(model)
    denoiser.write_context(torch.cat([held[0], held[1]], dim=2), cond, reference, 0)
    denoiser.write_context(torch.cat([held[4], held[5]], dim=2), cond, reference, 4)
    newest = _slots(cache, (4, 5))
    torch.testing.assert_close(cache.k[:, :, newest], reference.k[:, :, newest], atol=1e-6, rtol=0)
    # the chunk before it (frames 2-3) attends to the sinks only as well, not to nothing
    alone = _sink_cache(model)
    denoiser.write_context(torch.cat([held[2], held[3]], dim=2), cond, alone, 2)
    assert not torch.allclose(cache.k[:, :, _slots(cache, (2, 3))], alone.k[:, :, _slots(alone, (2, 3))])


def test_the_cache_pass_follows_frames_that_leave_the_window(model):
    denoiser = _Recording(model, FlowSchedule(2), chunk_frames=2)
    cache, cond = _sink_cache(model), Conditioning(_text(model, 1))
    written = write_held(denoiser, cache, _held(range(6)), cond, "a", {}, lambda frame: None)
    slid = _held([0, 1, 4, 5, 6, 7])  # frames 2-3 left the window for 6-7
    written = write_held(denoiser, cache, slid, cond, "a", written, lambda frame: None)
    assert denoiser.writes == [0, 2, 4, 6] and sorted(cache.cached_frames) == [0, 1, 4, 5, 6, 7]
    assert written == {(0, 1): "a", (4, 5): "a", (6, 7): "a"}
    write_held(denoiser, cache, _held([0, 1, 6, 7]), cond, "a", written, lambda frame: None, full=True)
    assert sorted(cache.cached_frames) == [0, 1, 6, 7]  # a full pass forgets what it does not hold
    # new sink groups rewrite everything: frame 1 alone is no longer the chunk it was written in
    denoiser.writes.clear()
    write_held(denoiser, cache, _held([0, 6, 7]), cond, "a", {(0, 1): "a", (6, 7): "a"}, lambda frame: None)
    assert denoiser.writes == [0, 6] and sorted(cache.cached_frames) == [0, 6, 7]
