"""CausalWanTransformer against diffusers' WanTransformer3DModel, and chunked == whole-sequence."""

import numpy as np
import pytest
import torch
from diffusers import WanTransformer3DModel

from tests.models.conftest import TINY, relative_error
from vidgen.attention import AttentionPattern
from vidgen.models import CausalWanTransformer, RopePositionMode

TOL = 1e-5  # relative error, fp32


def _pair(**overrides):
    config = {**TINY, **overrides}
    reference = WanTransformer3DModel(**config).eval()
    ours = CausalWanTransformer(**config).eval()
    ours.load_state_dict(reference.state_dict(), strict=True)
    return reference, ours


@pytest.mark.parametrize(
    "overrides, shape",
    [
        ({}, (2, 4, 5, 6, 8)),  # odd frame count, non-square latent
        ({"cross_attn_norm": False}, (1, 4, 3, 4, 4)),
        ({"patch_size": (1, 1, 1), "num_attention_heads": 3, "attention_head_dim": 18}, (1, 4, 2, 3, 5)),
        ({"patch_size": (2, 2, 2), "in_channels": 3, "out_channels": 5}, (2, 3, 4, 4, 6)),
    ],
)
def test_full_attention_matches_diffusers(overrides, shape):
    reference, ours = _pair(**overrides)
    x = torch.randn(shape)
    timestep = torch.tensor([10.0, 700.0][: shape[0]])
    text = torch.randn(shape[0], 7, TINY["text_dim"])
    with torch.no_grad():
        expected = reference(x, timestep, text).sample
        got = ours(x, timestep, text).sample
    assert got.shape == expected.shape
    assert relative_error(got, expected) <= TOL


def test_per_frame_timestep_matches_diffusers_per_token():
    reference, ours = _pair()
    x = torch.randn(2, 4, 5, 6, 8)
    per_frame = torch.rand(2, 5) * 1000
    per_token = per_frame.repeat_interleave(3 * 4, dim=1)  # 3x4 tokens per latent frame
    text = torch.randn(2, 7, TINY["text_dim"])
    with torch.no_grad():
        expected = reference(x, per_token, text).sample
        got = ours(x, per_frame, text).sample
    assert relative_error(got, expected) <= TOL


def test_per_frame_timestep_constant_equals_per_sample():
    _, ours = _pair()
    x = torch.randn(1, 4, 3, 4, 4)
    text = torch.randn(1, 7, TINY["text_dim"])
    with torch.no_grad():
        a = ours(x, torch.tensor([321.0]), text).sample
        b = ours(x, torch.full((1, 3), 321.0), text).sample
    assert relative_error(a, b) <= TOL


def _chunked(model, x, timesteps, text, chunk, sinks, window, rope_mode="absolute", chunks_per_call=1):
    frames, h, w = x.shape[2:]
    cache = model.make_kv_cache(
        batch_size=x.shape[0], latent_height=h, latent_width=w, sink_frames=sinks, window_frames=window
    )
    context = model.encode_text(text)
    outputs = []
    step = chunk * chunks_per_call
    frame_tokens = model.frame_tokens(h, w)
    pattern = AttentionPattern.block_causal(frame_tokens, chunk) if chunks_per_call > 1 else None
    for start in range(0, frames, step):
        part = slice(start, start + step)
        out = model(
            x[:, :, part],
            timesteps[:, part],
            text_context=context,
            kv_cache=cache,
            frame_offset=start,
            update_cache=True,
            rope_mode=rope_mode,
            attention_pattern=pattern,
        ).sample
        outputs.append(out)
    return torch.cat(outputs, dim=2), cache


@pytest.mark.parametrize("text_modulation, text_velocity", [(False, False), (True, False), (False, True)])
def test_chunked_with_cache_equals_block_causal_forward(text_modulation, text_velocity):
    _, model = _pair()
    if text_modulation:  # random weights: the cached text context must carry the modulation
        model = _with_text_modulation(model, 0.05)
    if text_velocity:  # and the velocity, with the cached keys' moving frame at their own frames
        model = _with_text_velocity(model, 0.7)
    x = torch.randn(1, 4, 9, 4, 6)  # 3 chunks of 3 latent frames
    timesteps = torch.rand(1, 9) * 1000
    text = torch.randn(1, 7, TINY["text_dim"])
    pattern = AttentionPattern.block_causal(frame_tokens=2 * 3, chunk_frames=3)
    with torch.no_grad():
        whole = model(x, timesteps, text, attention_pattern=pattern).sample
        chunked, cache = _chunked(model, x, timesteps, text, chunk=3, sinks=0, window=9)
    assert relative_error(chunked, whole) <= TOL
    assert cache.cached_frames == list(range(9))
    if text_modulation:
        context = model.encode_text(text)
        assert context.extras["modulation"] is not None and context.extras["modulation"].shape == (
            1,
            6,
            model.inner_dim,
        )
        both = type(context).cat([context, context])  # guidance batches contexts: the modulation too
        assert torch.equal(both.select(slice(1, 2)).extras["modulation"], context.extras["modulation"])


@pytest.mark.parametrize(
    "sinks, window, text_velocity",
    [(2, 4, False), (0, 4, False), (2, 2, False), (4, 2, False), (2, 20, False), (2, 4, True)],
)
def test_chunked_sliding_window_equals_windowed_forward(sinks, window, text_velocity):
    _, model = _pair()
    if text_velocity:
        model = _with_text_velocity(model, 0.7)
    frames = 14
    x = torch.randn(1, 4, frames, 4, 6)
    timesteps = torch.rand(1, frames) * 1000
    text = torch.randn(1, 7, TINY["text_dim"])
    pattern = AttentionPattern.sliding_window(
        frame_tokens=6, chunk_frames=2, window_frames=window, sink_frames=sinks
    )
    with torch.no_grad():
        whole = model(x, timesteps, text, attention_pattern=pattern).sample
        chunked, _ = _chunked(model, x, timesteps, text, chunk=2, sinks=sinks, window=window)
    assert relative_error(chunked, whole) <= TOL


def test_several_chunks_per_call_equal_one_at_a_time():
    """Diffusion-forcing pipelining feeds a few chunks at once under a block-causal pattern; while
    the cache keeps all history the result is the same as one chunk at a time."""
    _, model = _pair()
    x = torch.randn(1, 4, 12, 4, 4)
    timesteps = torch.rand(1, 12) * 1000
    text = torch.randn(1, 7, TINY["text_dim"])
    with torch.no_grad():
        one, _ = _chunked(model, x, timesteps, text, chunk=2, sinks=0, window=12)
        two, _ = _chunked(model, x, timesteps, text, chunk=2, sinks=0, window=12, chunks_per_call=2)
    assert relative_error(two, one) <= TOL


def test_rolling_positions_without_sinks_equal_absolute():
    """RoPE sees only position differences: shifting the window keeps the output (no sinks)."""
    _, model = _pair()
    x = torch.randn(1, 4, 16, 4, 4)
    timesteps = torch.rand(1, 16) * 1000
    text = torch.randn(1, 7, TINY["text_dim"])
    with torch.no_grad():
        absolute, _ = _chunked(model, x, timesteps, text, chunk=2, sinks=0, window=4, rope_mode="absolute")
        rolling, _ = _chunked(model, x, timesteps, text, chunk=2, sinks=0, window=4, rope_mode="rolling")
    assert relative_error(rolling, absolute) <= TOL


def test_rolling_positions_with_sinks_equal_absolute_until_the_window_slides():
    _, model = _pair()
    x = torch.randn(1, 4, 16, 4, 4)
    timesteps = torch.rand(1, 16) * 1000
    text = torch.randn(1, 7, TINY["text_dim"])
    with torch.no_grad():
        absolute, _ = _chunked(model, x, timesteps, text, chunk=2, sinks=2, window=4, rope_mode="absolute")
        rolling, _ = _chunked(model, x, timesteps, text, chunk=2, sinks=2, window=4, rope_mode="rolling")
    # up to frame sinks + window the schemes are identical; afterwards the sinks move closer
    assert relative_error(rolling[:, :, :8], absolute[:, :, :8]) <= TOL
    assert relative_error(rolling[:, :, 8:], absolute[:, :, 8:]) > 1e-4


def test_rolling_positions_stay_bounded_for_long_videos():
    """Far past rope_max_seq_len (64 here) the rolling scheme still runs and costs the same."""
    _, model = _pair()
    cache = model.make_kv_cache(batch_size=1, latent_height=4, latent_width=4, sink_frames=2, window_frames=4)
    context = model.encode_text(torch.randn(1, 7, TINY["text_dim"]))
    chunk = torch.randn(1, 4, 2, 4, 4)
    with torch.no_grad():
        for start in range(0, 400, 2):
            out = model(
                chunk,
                torch.tensor([500.0]),
                text_context=context,
                kv_cache=cache,
                frame_offset=start,
                update_cache=True,
                rope_mode=RopePositionMode.ROLLING,
            ).sample
    assert torch.isfinite(out).all()
    assert sorted(cache.cached_frames) == [0, 1, 396, 397, 398, 399]
    with pytest.raises(ValueError, match="rope_max_seq_len"):
        model(
            chunk,
            torch.tensor([500.0]),
            text_context=context,
            kv_cache=cache,
            frame_offset=400,
            rope_mode="absolute",
        )


def test_text_context_reused_equals_fresh_encoding():
    _, model = _pair()
    x = torch.randn(1, 4, 2, 4, 4)
    text = torch.randn(1, 7, TINY["text_dim"])
    with torch.no_grad():
        a = model(x, torch.tensor([5.0]), text).sample
        b = model(x, torch.tensor([5.0]), text_context=model.encode_text(text)).sample
    assert torch.equal(a, b)


def test_gradients_flow_through_block_causal_training_forward():
    _, model = _pair()
    model.train()
    x = torch.randn(2, 4, 4, 4, 4)
    pattern = AttentionPattern.block_causal(frame_tokens=4, chunk_frames=2)
    out = model(
        x, torch.rand(2, 4) * 1000, torch.randn(2, 7, TINY["text_dim"]), attention_pattern=pattern
    ).sample
    out.square().mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_bad_inputs_raise_clear_errors():
    _, model = _pair()
    with pytest.raises(ValueError, match="per-frame timestep"):
        model(torch.randn(1, 4, 3, 4, 4), torch.rand(1, 2), torch.randn(1, 7, 16))
    with pytest.raises(ValueError, match="encoder_hidden_states or text_context"):
        model(torch.randn(1, 4, 3, 4, 4), torch.rand(1))
    with pytest.raises(ValueError, match="not divisible"):
        model.latent_grid(5, 4)
    with pytest.raises(ValueError, match="I2V"):
        CausalWanTransformer(**{**TINY, "image_dim": 32, "added_kv_proj_dim": 24})


def test_dtype_answers_as_diffusers_does():
    """The fast ``dtype`` equals diffusers' walk over the modules: float32, after ``.to(bf16)``
    (the float32-kept norms do not count), and under layerwise casting (its compute dtype)."""
    from diffusers.models.modeling_utils import get_parameter_dtype

    model = CausalWanTransformer(**TINY)
    assert model.dtype == get_parameter_dtype(model) == torch.float32
    model.to(torch.bfloat16)
    assert model.dtype == get_parameter_dtype(model) == torch.bfloat16
    model = CausalWanTransformer(**TINY)
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
    assert get_parameter_dtype(model) == torch.bfloat16
    assert model.dtype == torch.bfloat16
    assert model.patch_embedding.weight.dtype == torch.float32  # skipped: the hook decides, not the weight


def test_a_zero_position_table_changes_nothing_and_a_learned_one_is_per_grid_cell(tiny_config, tmp_path):
    """spatial_pos_grid (our addition, off for Wan): created at zero the model computes exactly what
    it did without the table; a table's value at a cell moves that cell's token only; another grid
    interpolates it (corners kept); the table round-trips through save_pretrained."""
    torch.manual_seed(0)
    plain = CausalWanTransformer(**tiny_config).eval()
    with_table = CausalWanTransformer(**tiny_config, spatial_pos_grid=(3, 4)).eval()
    missing, unexpected = with_table.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["spatial_pos"] and not unexpected
    x = torch.randn(1, tiny_config["in_channels"], 3, 6, 8)  # 3 frames of 3 x 4 tokens
    t = torch.tensor([500.0])
    text = torch.randn(1, 5, tiny_config["text_dim"])
    with torch.no_grad():
        expected = plain(x, t, text, return_dict=False)[0]
        torch.testing.assert_close(with_table(x, t, text, return_dict=False)[0], expected, rtol=0, atol=0)

        with_table.spatial_pos[0, :, 0, 1, 2] = 1.0  # one cell: row 1, column 2
        inputs = {}
        for name, model in (("plain", plain), ("table", with_table)):
            hook = model.blocks[0].register_forward_pre_hook(
                lambda m, a, name=name: inputs.update({name: a[0]})
            )
            model(x, t, text, return_dict=False)
            hook.remove()
    # the blocks' input tokens (B, frames * 12, D): frame-major, row-major; the cell is token 6 of
    # every frame, moved by exactly the table's value, and no other token moves
    moved = (inputs["table"] - inputs["plain"]).unflatten(1, (3, 12))
    torch.testing.assert_close(moved[:, :, 6], torch.ones_like(moved[:, :, 6]))
    assert moved[:, :, [i for i in range(12) if i != 6]].abs().max() == 0

    larger = with_table._spatial_pos(5, 7)
    assert larger.shape == (1, with_table.inner_dim, 1, 5, 7)
    table = with_table.spatial_pos
    for (r, c), (R, C) in (((0, 0), (0, 0)), ((2, 3), (4, 6)), ((0, 3), (0, 6))):
        torch.testing.assert_close(larger[..., R, C], table[..., r, c])
    assert with_table._spatial_pos(3, 4) is table

    with_table.save_pretrained(tmp_path)
    loaded = CausalWanTransformer.from_pretrained(tmp_path)
    assert loaded.config.spatial_pos_grid == [3, 4] or tuple(loaded.config.spatial_pos_grid) == (3, 4)
    torch.testing.assert_close(loaded.spatial_pos, table)


# ----------------------------------------------------------------------------- kept autocast weights


def _linear_pair():
    from vidgen.models.transformer import Linear

    torch.manual_seed(0)
    plain = torch.nn.Linear(24, 40)
    kept = Linear(24, 40)
    kept.load_state_dict(plain.state_dict())
    return plain.requires_grad_(False), kept.requires_grad_(False)


def test_kept_cast_linear_is_bitwise_autocast_and_follows_weight_changes():
    plain, kept = _linear_pair()
    x = torch.randn(3, 5, 24)

    def both():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return plain(x), kept(x)

    expected, got = both()
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)
    assert kept._cast is not None and kept._cast[1].dtype == torch.bfloat16  # kept for the next call
    cast_weight = kept._cast[1]
    expected, got = both()
    assert kept._cast[1] is cast_weight and torch.equal(got, expected)  # reused, not remade
    # an in-place update bumps the weight's version: the kept cast is remade
    with torch.no_grad():
        plain.weight.mul_(-2.0)
        kept.weight.mul_(-2.0)
        plain.bias.add_(1.0)
        kept.bias.add_(1.0)
    expected, got = both()
    assert torch.equal(got, expected)
    # another tensor in the parameter (a load with assign=True, a device move)
    new = torch.randn(40, 24)
    plain.weight.data = new.clone()
    kept.weight.data = new.clone()
    expected, got = both()
    assert torch.equal(got, expected)


def test_drop_cast_weights_catches_updates_through_data():
    from vidgen.models import drop_cast_weights

    plain, kept = _linear_pair()
    model = torch.nn.Sequential(torch.nn.Identity(), kept)
    x = torch.randn(4, 24)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
        plain.weight.data += 1.0  # as peft fuses a LoRA: no version bump, the same storage
        kept.weight.data += 1.0
        stale = model(x)
        drop_cast_weights(model)
        fresh = model(x)
        expected = plain(x)
    assert not torch.equal(stale, expected)  # why the pipeline drops them per video
    assert torch.equal(fresh, expected)


def test_kept_cast_linear_outside_autocast_and_in_training_is_plain_linear():
    plain, kept = _linear_pair()
    x = torch.randn(2, 24)
    with torch.no_grad():
        assert torch.equal(kept(x), plain(x)) and kept(x).dtype == torch.float32
    assert kept._cast is None
    kept.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kept(x).float().sum().backward()
    assert kept.weight.grad is not None and kept.weight.grad.abs().sum() > 0
    assert kept._cast is None  # gradients go to the float32 weight itself


def test_pipeline_remakes_kept_casts_for_each_video():
    """A weight changed through ``.data`` between two videos (as a fused LoRA is) shows in the
    second video: it equals a fresh pipeline's with the same change (bf16 autocast, where the
    casts are kept)."""
    from tests.tiny import tiny_components

    bf16 = {"runtime.autocast": "bfloat16"}
    pipe, fresh = tiny_components(**bf16), tiny_components(**bf16)
    prompt = "a red circle moving right on a black background"
    first = np.concatenate([c.frames for c in pipe.stream(prompt, seconds=1, generator=0)])
    for model in (pipe.transformer, fresh.transformer):
        for block in model.blocks:
            block.ffn.net[2].weight.data *= 3.0
    got = np.concatenate([c.frames for c in pipe.stream(prompt, seconds=1, generator=0)])
    expected = np.concatenate([c.frames for c in fresh.stream(prompt, seconds=1, generator=0)])
    assert not np.array_equal(first, expected)
    assert np.array_equal(got, expected)


def _with_text_modulation(model: CausalWanTransformer, scale: float) -> CausalWanTransformer:
    """``model`` with a text modulation, its weights random (``scale``) or zero (0)."""
    config = {**model.config, "text_modulation": True}
    modulated = CausalWanTransformer(**config).eval()
    missing, unexpected = modulated.load_state_dict(model.state_dict(), strict=False)
    assert sorted(missing) == ["text_to_modulation.bias", "text_to_modulation.weight"] and not unexpected
    with torch.no_grad():
        for p in modulated.text_to_modulation.parameters():
            p.copy_(torch.randn_like(p) * scale)
    return modulated


def _prompted_inputs():
    """The plain model, two latents, their timesteps and a prompt of 5 tokens padded to 7 (zeros,
    as the encoders write the padding)."""
    _, model = _pair()
    text = torch.randn(2, 7, TINY["text_dim"])
    text[:, 5:] = 0
    return model, torch.randn(2, 4, 3, 4, 6), torch.tensor([10.0, 700.0]), text


def test_text_modulation_starts_as_the_model_without_it_and_then_reads_the_prompt():
    model, x, timestep, text = _prompted_inputs()  # the padding is left out of the mean
    with torch.no_grad():
        plain = model(x, timestep, text).sample
        created = _with_text_modulation(model, 0.0)
        assert torch.equal(created(x, timestep, text).sample, plain)  # zero at the start: the same function
        modulated = _with_text_modulation(model, 0.05)
        got = modulated(x, timestep, text).sample
        assert relative_error(got, plain) > 1e-2
        # the mean over the prompt's tokens: more padding changes nothing, another prompt does
        padded = torch.cat([text, torch.zeros(2, 4, TINY["text_dim"])], dim=1)
        by_text = modulated.encode_text(text).extras["modulation"]
        torch.testing.assert_close(modulated.encode_text(padded).extras["modulation"], by_text)
        mean = text[:, :5].mean(dim=1)
        weight, bias = modulated.text_to_modulation.weight, modulated.text_to_modulation.bias
        torch.testing.assert_close(by_text, (mean @ weight.T + bias).unflatten(1, (6, -1)))
        other = text.clone()
        other[:, 0] += 1.0
        assert relative_error(modulated(x, timestep, other).sample, got) > 1e-3


def _with_text_velocity(model: CausalWanTransformer, gain: float) -> CausalWanTransformer:
    """``model`` with a text velocity: random pooling weights (velocities of a few grid cells a
    frame) and per-head gains drawn at ``gain`` scale (0: as created)."""
    config = {**model.config, "text_velocity": True}
    moving = CausalWanTransformer(**config).eval()
    missing, unexpected = moving.load_state_dict(model.state_dict(), strict=False)
    expected = ["text_to_velocity.score.bias", "text_to_velocity.score.weight", "text_to_velocity.value.bias"]
    assert sorted(missing) == [*expected, "text_to_velocity.value.weight", "velocity_gain"] and not unexpected
    with torch.no_grad():
        moving.text_to_velocity.value.weight.normal_(0, 1.0)
        moving.velocity_gain.copy_(torch.randn_like(moving.velocity_gain) * gain)
    return moving


def test_text_velocity_starts_as_the_model_without_it_and_then_reads_the_prompt():
    model, x, timestep, text = _prompted_inputs()  # the padding is left out of the pooling
    with torch.no_grad():
        plain = model(x, timestep, text).sample
        created = CausalWanTransformer(**{**model.config, "text_velocity": True}).eval()
        created.load_state_dict(model.state_dict(), strict=False)
        assert torch.equal(
            created.velocity_gain, torch.zeros(TINY["num_layers"], TINY["num_attention_heads"])
        )
        assert torch.equal(created(x, timestep, text).sample, plain)  # zero gains: the same function
        moving = _with_text_velocity(model, 0.7)
        got = moving(x, timestep, text).sample
        assert relative_error(got, plain) > 1e-2
        # attention pooling over the prompt's tokens: padding changes nothing
        velocity = moving.encode_text(text).extras["velocity"]
        padded = torch.cat([text, torch.zeros(2, 4, TINY["text_dim"])], dim=1)
        torch.testing.assert_close(moving.encode_text(padded).extras["velocity"], velocity)
        pool = moving.text_to_velocity
        weights = torch.softmax(pool.score(text[:, :5]).squeeze(-1), dim=-1)
        torch.testing.assert_close(velocity, (weights[..., None] * pool.value(text[:, :5])).sum(dim=1))
        # the velocity, not the prompt's other reading, moves the output: the same prompt with
        # another velocity gives another output; velocity zero gives the plain model's
        context = moving.encode_text(text)
        context.extras["velocity"] = torch.zeros_like(context.extras["velocity"])
        torch.testing.assert_close(
            moving(x, timestep, text_context=context).sample, plain, rtol=1e-5, atol=1e-5
        )


def test_moving_frame_rotation_equals_the_rotation_at_moved_positions():
    """Rotation by WanRope at (t, h, w) then by the motion phases at gain g equals the rotary
    embedding of (t, h - g v_rows t, w - g v_columns t), computed here from Wan's frequencies."""
    from vidgen.models.extensions import apply_motion, axis_frequencies, motion_phases
    from vidgen.models.rope import WanRope, apply_rope

    head_dim, theta = 24, 10000.0
    rope = WanRope(head_dim, 64, theta)
    frames, rows, columns = 3, 4, 5
    positions = torch.tensor([0, 1, 5])
    velocity = torch.tensor([[0.5, -1.25], [2.0, 0.0]])
    gain = torch.tensor([1.0, -0.5])  # two heads, each its own multiple of the velocity
    x = torch.randn(2, frames * rows * columns, 2, head_dim, dtype=torch.float64)
    phases = motion_phases(axis_frequencies(rope, positions.device), positions, rows * columns, velocity)
    got = apply_motion(apply_rope(x, rope(positions, rows, columns)), phases, gain)

    t_dim = head_dim - 2 * 2 * (head_dim // 6)
    dims = (t_dim, (head_dim - t_dim) // 2, (head_dim - t_dim) // 2)
    freqs = [1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d) for d in dims]
    t, h, w = torch.meshgrid(
        positions.double(), torch.arange(rows).double(), torch.arange(columns).double(), indexing="ij"
    )
    t, h, w = t.flatten(), h.flatten(), w.flatten()
    for b in range(2):
        for head in range(2):
            moved_h = h - gain[head] * velocity[b, 0] * t
            moved_w = w - gain[head] * velocity[b, 1] * t
            angles = torch.cat(
                [t[:, None] * freqs[0], moved_h[:, None] * freqs[1], moved_w[:, None] * freqs[2]], dim=1
            )
            pairs = x[b, :, head].unflatten(-1, (-1, 2))
            expected = torch.stack(
                (
                    pairs[..., 0] * angles.cos() - pairs[..., 1] * angles.sin(),
                    pairs[..., 0] * angles.sin() + pairs[..., 1] * angles.cos(),
                ),
                dim=-1,
            ).flatten(-2)
            torch.testing.assert_close(got[b, :, head], expected, rtol=1e-5, atol=1e-5)
