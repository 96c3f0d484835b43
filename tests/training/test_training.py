"""Training runs a few steps on tiny configs, the loss goes down, and runs resume exactly."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from tests.tiny import TINY_TRANSFORMER
from vidgen.config import load_config
from vidgen.training.autoencoder import finalize_autoencoder, train_autoencoder
from vidgen.training.configs import AutoencoderTrainConfig, TransformerTrainConfig
from vidgen.training.loop import cosine_lr
from vidgen.training.transformer import check_config, make_sample, train_transformer

TINY_AE = dict(size=32, num_frames=5, batch_size=4, z_dim=4, hidden_channels=16, eval_clips=2, log_every=5)
TINY_DIT = dict(
    size=32,
    batch_size=2,
    max_gap=4,
    compile=False,
    log_every=5,
    model={**TINY_TRANSFORMER, "rope_max_seq_len": 32},
)


def _losses(run_dir):
    lines = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [line["loss"] for line in lines if "loss" in line]


@pytest.fixture(scope="module")
def autoencoder(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ae")
    train_autoencoder(
        AutoencoderTrainConfig(run_dir=str(run_dir), steps=40, lr=3e-3, warmup=5, save_every=40, **TINY_AE)
    )
    final = finalize_autoencoder(run_dir, run_dir / "final", clips=4, size=32)
    return run_dir, final


def test_autoencoder_loss_goes_down(autoencoder):
    run_dir, final = autoencoder
    losses = _losses(run_dir)
    assert len(losses) == 8 and losses[-1] < 0.6 * losses[0]
    config = json.loads((final / "config.json").read_text())
    assert len(config["latents_mean"]) == 4 and all(s > 0 for s in config["latents_std"])


def test_transformer_loss_goes_down_and_resumes_exactly(autoencoder, tmp_path):
    _, final = autoencoder
    full = tmp_path / "full"
    config = dict(autoencoder=str(final), lr=2e-3, warmup=5, save_every=10, **TINY_DIT)
    train_transformer(TransformerTrainConfig(run_dir=str(full), steps=30, **config))
    losses = _losses(full)
    assert losses[-1] < losses[0]
    # a run stopped at step 10 and resumed ends with the same weights as an uninterrupted one
    split = tmp_path / "split"
    train_transformer(TransformerTrainConfig(run_dir=str(split), steps=30, stretch_steps=10, **config))
    state = json.loads((split / "latest" / "state.json").read_text())
    assert state["step"] == 10
    train_transformer(TransformerTrainConfig(run_dir=str(split), steps=30, **config))
    from safetensors.torch import load_file

    a = load_file(str(full / "latest" / "ema.safetensors"))
    b = load_file(str(split / "latest" / "ema.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_samples_follow_the_prompt_change_layout():
    config = TransformerTrainConfig(**{k: v for k, v in TINY_DIT.items() if k != "model"})
    rng = np.random.default_rng(0)
    kinds = {"plain": 0, "change": 0}
    for _ in range(60):
        sample = make_sample(rng, config)
        frames = 1 + 4 * (config.sink_frames + config.window_frames + config.chunk_frames - 1)
        assert sample.frames.shape == (frames, 32, 32, 3)
        assert len(sample.loss_chunks) == 4 and sample.loss_chunks[-1]
        kinds["plain" if all(sample.loss_chunks) and sample.text == sample.previous_text else "change"] += 1
    assert kinds["plain"] > 20 and kinds["change"] > 5


def test_cosine_schedule():
    assert cosine_lr(0, lr=1.0, warmup=10, steps=100, floor=0.1) == pytest.approx(0.1)
    assert cosine_lr(10, lr=1.0, warmup=10, steps=100, floor=0.1) == pytest.approx(1.0)
    assert cosine_lr(100, lr=1.0, warmup=10, steps=100, floor=0.1) == pytest.approx(0.1)


def test_object_weight_marks_the_latent_cells_of_the_object():
    from vidgen.training.transformer import latent_object_weight

    masks = torch.zeros(1, 9, 32, 32)
    masks[:, 0, 0:4, 0:4] = 1.0  # frame 0 alone -> latent frame 0
    masks[:, 8, 16:20, 16:20] = 1.0  # the last frame of the second group -> latent frame 2
    weight = latent_object_weight(masks, temporal=4, spatial=4, strength=5.0)
    assert weight.shape == (1, 3, 8, 8)
    assert weight[0, 0, 0, 0] == 6.0 and weight[0, 0, 1, 1] == 6.0 and weight[0, 0, 3, 3] == 1.0
    assert weight[0, 1].max() == 1.0  # nothing in frames 1-4
    assert weight[0, 2, 4, 4] == 6.0 and weight[0, 2, 3, 3] == 6.0 and weight[0, 2, 0, 0] == 1.0


def test_compact_checkpoint_resumes(autoencoder, tmp_path):
    from vidgen.training.checkpoint import export_compact_checkpoint

    _, final = autoencoder
    config = dict(autoencoder=str(final), lr=2e-3, warmup=5, save_every=10, **TINY_DIT)
    run = tmp_path / "run"
    train_transformer(TransformerTrainConfig(run_dir=str(run), steps=10, **config))
    compact = tmp_path / "compact"
    export_compact_checkpoint(run, compact)
    assert not (compact / "latest" / "optimizer.safetensors").exists()
    from safetensors.torch import load_file

    full, small = (load_file(str(d / "latest" / "model.safetensors")) for d in (run, compact))
    assert {v.dtype for v in small.values()} == {torch.float16}  # half the repository's bytes
    for name, weight in full.items():
        torch.testing.assert_close(small[name].float(), weight, rtol=1e-3, atol=1e-4)
    train_transformer(TransformerTrainConfig(run_dir=str(compact), steps=20, **config))
    state = json.loads((compact / "latest" / "state.json").read_text())
    assert state["step"] == 20 and (compact / "latest" / "optimizer.safetensors").exists()


def test_a_compact_checkpoint_without_its_average_resumes_from_the_weights(autoencoder, tmp_path):
    """``vidgen train compact --without-ema`` (a grown model's checkpoint within the repository's
    budget): the resumed run's average starts from the stored weights, not from a fresh model."""
    from safetensors.torch import load_file

    from vidgen.models import CausalWanTransformer
    from vidgen.training.checkpoint import EMA, export_compact_checkpoint, load_training_state
    from vidgen.training.configs import TransformerTrainConfig as Config

    _, final = autoencoder
    config = dict(autoencoder=str(final), lr=2e-3, warmup=5, save_every=10, **TINY_DIT)
    run = tmp_path / "run"
    train_transformer(TransformerTrainConfig(run_dir=str(run), steps=10, **config))
    compact = tmp_path / "compact"
    export_compact_checkpoint(run, compact, with_ema=False)
    assert sorted(p.name for p in (compact / "latest").glob("*.safetensors")) == ["model.safetensors"]
    model = CausalWanTransformer(**Config(**config).model)
    ema = EMA(model, 0.999)
    load_training_state(compact, model=model, ema=ema, optimizer=None)
    stored = load_file(str(compact / "latest" / "model.safetensors"))
    for name, weight in ema.model.state_dict().items():
        assert torch.equal(weight, stored[name].float()), name


def _within_float16(stored, source):
    """float16 keeps ~3 decimal digits."""
    return torch.allclose(stored.float(), source.float(), rtol=1e-3, atol=1e-6)


def test_export_writes_the_ema_or_the_raw_weights(autoencoder, tmp_path):
    """``vidgen train export --weights ema|raw`` stores that file of the run's latest checkpoint
    (within float16 rounding) and says which in ``training_state.json``."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    from vidgen.models import CausalWanTransformer

    _, final = autoencoder
    config = dict(autoencoder=str(final), lr=2e-3, warmup=2, save_every=10, **TINY_DIT)
    run = tmp_path / "run"
    train_transformer(TransformerTrainConfig(run_dir=str(run), steps=10, **config))
    saved = {
        w: load_file(str(run / "latest" / f"{f}.safetensors")) for w, f in (("raw", "model"), ("ema", "ema"))
    }
    for weights in ("ema", "raw"):
        out = tmp_path / weights
        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "vidgen",
                "train",
                "export",
                "--transformer-run",
                str(run),
                "--autoencoder",
                str(final),
                "--out",
                str(out),
                "--weights",
                weights,
            ],
            capture_output=True,
            text=True,
        )
        assert cli.returncode == 0, cli.stderr
        exported = CausalWanTransformer.from_pretrained(str(out / "transformer")).state_dict()
        other = saved["raw" if weights == "ema" else "ema"]

        assert all(_within_float16(exported[name], saved[weights][name]) for name in exported)
        assert not all(_within_float16(exported[name], other[name]) for name in exported)  # the other fails
        state = json.loads((out / "training_state.json").read_text())
        assert state["transformer_weights"] == weights and state["transformer_step"] == 10
        # as the shipped model: float32 sampling, whose videos do not follow the CPU's kernels
        assert load_config(out / "vidgen.toml").runtime.autocast == "off"


def test_sigterm_saves_the_step_and_stops(tmp_path):
    import dataclasses
    import os
    import signal

    from vidgen.training.loop import TrainingRun

    @dataclasses.dataclass
    class Config:
        run_dir: str = str(tmp_path)
        steps: int = 100
        minutes: float = 0.0
        stretch_steps: int = 0
        lr: float = 1e-2
        warmup: int = 1
        log_every: int = 1000
        save_every: int = 1000
        ema_decay: float = 0.9

    previous = signal.getsignal(signal.SIGTERM)
    model = torch.nn.Linear(2, 1)
    run = TrainingRun(Config(), model, torch.optim.SGD(model.parameters(), lr=1e-2), lr_floor=0.1)
    assert run.update(model(torch.ones(1, 2)).square().sum())
    os.kill(os.getpid(), signal.SIGTERM)  # handled: the process lives on
    assert not run.update(model(torch.ones(1, 2)).square().sum())  # the stretch ends at this step
    state = json.loads((tmp_path / "latest" / "state.json").read_text())
    assert state["step"] == 2  # saved although save_every is far away
    run.finish()
    assert signal.getsignal(signal.SIGTERM) is previous


def test_batched_text_pair_equals_prompt_by_prompt_encoding():
    from vidgen.models.text_encoders import MiniLMTextEncoder
    from vidgen.training.transformer import text_pair, text_pair_batched

    encoder = MiniLMTextEncoder.load(max_length=16)
    texts = ["a red circle moving left on a black background", "", "a tiny blue box"]
    previous = [texts[0], "", "a green wedge drifting up over a beige backdrop"]
    batched = text_pair_batched(encoder, texts, previous)
    assert batched.shape == (3, 32, 384)
    # the same embeddings, up to BLAS rounding of a batch of another shape
    torch.testing.assert_close(batched, text_pair(encoder, texts, previous), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(batched[0], batched[2], atol=1e-2)


def test_shape_contrast_weights_the_values_that_tell_the_shapes_apart():
    from vidgen.shapes import world
    from vidgen.training.transformer import shape_contrast_weight

    scene = world.Scene("black", "red", "circle", "large", "slow", "right")
    clip = world.render_clip(scene, 9, size=32, rng=0)
    # the same trajectory redrawn: the circle's own shape gives its frames back, another differs
    np.testing.assert_array_equal(world.redraw(clip, shape="circle"), clip.frames)
    square = world.redraw(clip, shape="square")
    differs = (square != clip.frames).any(axis=-1)
    assert (
        differs.any()
        and (
            differs
            <= (clip.masks > 0)
            | (
                world.render_clip(
                    scene.replace(shape="square"), 9, size=32, start=tuple(clip.centers[0])
                ).masks
                > 0
            )
        ).all()
    )
    z = torch.zeros(1, 2, 3, 4, 4)
    other = z.clone()
    other[0, 1, 2, 1, 1] = 2.0  # one latent value tells the two shapes apart
    weight = shape_contrast_weight(z, other, strength=4.0)
    assert weight.mean().item() == pytest.approx(1.0)
    assert weight[0, 1, 2, 1, 1] == pytest.approx(9 * weight[0, 0, 0, 0, 0].item())
    assert torch.equal(shape_contrast_weight(z, z, 4.0), torch.ones_like(z))


def test_shape_contrast_per_sample_gives_a_small_shape_the_extra_weight_of_a_large_one():
    """``per_sample_cap``: each sample's ``|z - z'|`` scaled to the batch's mean amount (within the
    cap), so one telling value (a small object) gets as much extra weight in all as 24 (a large
    one); a sample whose versions are equal keeps one weight throughout."""
    from vidgen.training.transformer import shape_contrast_weight

    z = torch.zeros(3, 2, 3, 4, 4)
    other = z.clone()
    other[0, 1, 2, 1, 1] = 2.0  # small: one value
    other[1, :, :, 1:3, 1:3] = 2.0  # large: 24 values

    def extra(weight):  # per sample: the weight above the base one, in all
        return (weight / weight[2, 0, 0, 0, 0] - 1.0).flatten(1).sum(dim=1)

    plain = extra(shape_contrast_weight(z, other, 4.0))
    assert plain[1] == pytest.approx(24 * plain[0].item(), rel=1e-5)
    scaled = shape_contrast_weight(z, other, 4.0, per_sample_cap=100.0)
    assert scaled.mean().item() == pytest.approx(1.0)
    assert extra(scaled)[0] == pytest.approx(extra(scaled)[1].item(), rel=1e-5)
    assert torch.all(scaled[2] == scaled[2, 0, 0, 0, 0])
    # the cap: the small sample scaled up by 2 at most, the large one down by 2 at most
    capped = extra(shape_contrast_weight(z, other, 4.0, per_sample_cap=2.0))
    assert capped[1] == pytest.approx(6 * capped[0].item(), rel=1e-5)
    with pytest.raises(ValueError, match="shape-contrast-per-sample"):
        check_config(TransformerTrainConfig(**TINY_DIT, shape_contrast_per_sample=0.5))


def test_training_passes_the_per_sample_cap_to_the_shape_contrast(autoencoder, tmp_path, monkeypatch):
    import vidgen.training.transformer as trainer

    caps, real = [], trainer.shape_contrast_weight

    def recording(latents, other, strength, per_sample_cap=0.0):
        caps.append((strength, per_sample_cap))
        return real(latents, other, strength, per_sample_cap)

    monkeypatch.setattr(trainer, "shape_contrast_weight", recording)
    _train_recording_swaps(
        autoencoder, tmp_path, monkeypatch, shape_contrast=4.0, shape_contrast_per_sample=8.0
    )
    assert caps == [(4.0, 8.0)] * 6


def test_temporal_weight_costs_the_clean_estimate_error_that_changes_between_frames():
    """``temporal_weight``: a model whose clean estimate is off by the same amount in every frame
    pays nothing more; one whose error flips sign from frame to frame pays the weight times
    (2a)^2 on the pairs of frames both in the loss, scaled by the larger object weight of the two."""
    from vidgen.training.transformer import diffusion_forcing_loss

    torch.manual_seed(2)
    latents = torch.randn(2, 4, 8, 4, 4)
    text = torch.randn(2, 6, TINY_DIT["model"]["text_dim"])
    base = {k: v for k, v in TINY_DIT.items() if k != "model"}
    a = 0.3

    def off_by(error):  # error (F,): the clean estimate noisy - sigma * v is latents - error
        def model(noisy, timestep, text, attention_pattern=None, return_dict=False):
            sigma = (timestep / 1000.0)[:, None, :, None, None]
            return ((noisy - latents) / sigma + error[None, None, :, None, None] / sigma,)

        return model

    def loss(model, weight, chunks, object_weight=None):
        config = TransformerTrainConfig(**base, clean_context_prob=0.0, temporal_weight=weight)
        generator = torch.Generator().manual_seed(5)
        return float(diffusion_forcing_loss(model, latents, text, chunks, config, generator, object_weight))

    every = torch.ones(2, 4, dtype=torch.bool)
    shared, flipping = off_by(torch.full((8,), a)), off_by(a * torch.tensor([1.0, -1] * 4))
    assert loss(shared, 3.0, every) == pytest.approx(loss(shared, 0.0, every), rel=1e-6)
    added = loss(flipping, 3.0, every) - loss(flipping, 0.0, every)
    assert added == pytest.approx(3.0 * (2 * a) ** 2, rel=1e-4)
    # chunk 2 of 4 out of the loss: the pairs touching its frames (2, 3) leave the term, the rest
    # are all flips, so the mean stays (2a)^2; an error changing only inside chunk 2 costs nothing
    some = torch.tensor([[True, False, True, True]] * 2)
    added = loss(flipping, 3.0, some) - loss(flipping, 0.0, some)
    assert added == pytest.approx(3.0 * (2 * a) ** 2, rel=1e-4)
    inside = off_by(torch.tensor([0.0, 0, a, -a, 0, 0, 0, 0]))
    assert loss(inside, 3.0, some) == pytest.approx(loss(inside, 0.0, some), abs=1e-7)
    # object weight 5 on every cell of frame 4: pairs (3, 4) and (4, 5) count 5 times
    cells = torch.ones(2, 8, 4, 4)
    cells[:, 4] = 5.0
    added = loss(flipping, 1.0, every, cells) - loss(flipping, 0.0, every, cells)
    assert added == pytest.approx((5 + 2 * 5) / 7 * (2 * a) ** 2, rel=1e-4)
    with pytest.raises(ValueError, match="temporal-weight"):
        check_config(TransformerTrainConfig(**base, temporal_weight=-1.0))


def test_oversize_swap_noises_only_the_forced_samples_and_keeps_the_target():
    """``forced_swap`` swaps exactly its samples' loss chunks from ``shape_swap_sigma`` up (the
    shape swap off), an oracle of the captioned clip still has zero loss, and no forced sample
    leaves the input as without it."""
    from vidgen.training.transformer import diffusion_forcing_loss

    torch.manual_seed(1)
    latents, oversize = torch.randn(3, 4, 8, 4, 4), torch.randn(3, 4, 8, 4, 4)
    text = torch.randn(3, 6, TINY_DIT["model"]["text_dim"])
    loss_chunks = torch.ones(3, 4, dtype=torch.bool)
    base = {k: v for k, v in TINY_DIT.items() if k != "model"}
    config = TransformerTrainConfig(**base, oversize_swap=0.5, shape_swap_sigma=0.3)
    seen = {}

    def oracle(name):
        def model(noisy, timestep, text, attention_pattern=None, return_dict=False):
            sigma = (timestep / 1000.0)[:, None, :, None, None]
            seen[name] = (noisy.clone(), sigma)
            return ((noisy - latents) / sigma,)

        return model

    def loss(name, forced):
        generator = torch.Generator().manual_seed(7)
        return diffusion_forcing_loss(
            oracle(name),
            latents,
            text,
            loss_chunks,
            config,
            generator,
            other_shape_latents=oversize,
            forced_swap=forced,
        )

    assert float(loss("none", None)) < 1e-8
    forced = torch.tensor([False, True, False])
    assert float(loss("forced", forced)) < 1e-8
    plain, sigma = seen["none"]
    diff = seen["forced"][0] - plain
    sigma_chunks = sigma[:, 0, ::2, 0, 0]
    assert diff[0].abs().max() == 0 and diff[2].abs().max() == 0
    high = (sigma_chunks[1] >= 0.3) & (sigma_chunks[1] > config.context_sigma_max)
    assert high.any() and (~high).any()  # this seed gives the forced sample both kinds of chunk
    for f in range(8):
        if high[f // 2]:
            expected = (1 - sigma[1, :, f]) * (oversize[1, :, f] - latents[1, :, f])
            torch.testing.assert_close(diff[1, :, f], expected, rtol=1e-4, atol=1e-5)
        else:
            assert diff[1, :, f].abs().max() == 0


def _train_recording_swaps(autoencoder, tmp_path, monkeypatch, **swap):
    """Train 6 tiny steps (half the captions dropped) with ``swap`` settings; return, per step, the
    loss's clean latents, swap latents and forced-swap mask, and the step's samples."""
    import vidgen.training.transformer as trainer

    _, final = autoencoder
    samples, calls = [], []
    make, loss = trainer.make_sample, trainer.diffusion_forcing_loss

    def recording_make(rng, config):
        samples.append(make(rng, config))
        return samples[-1]

    def recording_loss(model, latents, *args, **kwargs):
        swap = args[-2].clone() if args[-2] is not None else None
        recorded = dict(kwargs, object_weight=args[4])
        calls.append((latents.clone(), swap, args[-1], list(samples[-latents.shape[0] :]), recorded))
        return loss(model, latents, *args, **kwargs)

    monkeypatch.setattr(trainer, "make_sample", recording_make)
    monkeypatch.setattr(trainer, "diffusion_forcing_loss", recording_loss)
    config = dict(autoencoder=str(final), lr=2e-3, warmup=2, save_every=10, caption_dropout=0.5, **TINY_DIT)
    run = tmp_path / "run"
    train_transformer(TransformerTrainConfig(run_dir=str(run), steps=6, **swap, **config))
    assert all(np.isfinite(_losses(run))) and len(calls) == 6
    return calls


def _refused_by_train_cli(run_dir, *flags: str, named: str):
    """Run ``vidgen train transformer --run-dir RUN_DIR FLAGS``; assert it exits 2 with an error
    naming ``named`` and no traceback; return the finished process."""
    import subprocess
    import sys

    cli = subprocess.run(
        [sys.executable, "-m", "vidgen", "train", "transformer", "--run-dir", str(run_dir), *flags],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 2 and named in cli.stderr and "Traceback" not in cli.stderr
    return cli


def test_oversize_swap_trains_on_larger_copies_of_captioned_samples(autoencoder, tmp_path, monkeypatch):
    """A run with ``oversize_swap`` 1 (no shape swap) redraws every captioned sample larger, hands
    the loss its latents as the swap for exactly those samples, forced; a dropped caption keeps its
    clip. The CLI refuses a scale that does not enlarge (exit 2, one line)."""

    calls = _train_recording_swaps(autoencoder, tmp_path, monkeypatch, oversize_swap=1.0)
    kinds = set()
    for latents, swap, forced, batch, _ in calls:
        for k, sample in enumerate(batch):
            captioned = bool(sample.text)
            kinds.add(captioned)
            assert (sample.oversize_frames is not None) is captioned
            assert bool(forced[k]) is captioned
            assert torch.equal(swap[k], latents[k]) is not captioned
            if captioned:  # the object covers more of the canvas in the larger copy
                background = sample.frames[:, :1, :1]
                assert (sample.oversize_frames != background).any(-1).sum() > 2 * (
                    sample.frames != background
                ).any(-1).sum()
    assert kinds == {True, False}
    cli = _refused_by_train_cli(
        tmp_path / "y", "--oversize-swap", "0.5", "--oversize-scale", "0.8", named="--oversize-scale"
    )
    assert len(cli.stderr.strip().splitlines()) == 1


def test_samples_carry_the_other_shape_only_when_asked(autoencoder):
    _, final = autoencoder
    plain = make_sample(np.random.default_rng(3), TransformerTrainConfig(autoencoder=str(final), **TINY_DIT))
    assert plain.other_shape_frames is None
    config = TransformerTrainConfig(autoencoder=str(final), shape_contrast=4.0, **TINY_DIT)
    sample = make_sample(np.random.default_rng(3), config)
    assert sample.other_shape_frames.shape == sample.frames.shape
    np.testing.assert_array_equal(sample.frames, plain.frames)  # the data stream is unchanged
    # another shape on the same trajectory: only the pixels around the object change
    differs = (sample.other_shape_frames != sample.frames).any(axis=-1)
    assert 0 < differs.mean() < 0.1


def test_overfit_clips_draws_every_sample_from_the_fixed_ones(autoencoder, tmp_path, monkeypatch):
    import vidgen.training.transformer as trainer

    _, final = autoencoder
    config = TransformerTrainConfig(
        run_dir=str(tmp_path / "run"), autoencoder=str(final), steps=4, warmup=1, overfit_clips=3, **TINY_DIT
    )
    drawn = []
    real = trainer.make_sample

    def recording(rng, config):
        sample = real(rng, config)
        drawn.append(sample.frames.tobytes() + sample.text.encode())
        return sample

    monkeypatch.setattr(trainer, "make_sample", recording)
    trainer.train_transformer(config)
    fixed = [real(trainer.fixed_sample_rng(config, k), config) for k in range(3)]
    fixed = [s.frames.tobytes() + s.text.encode() for s in fixed]
    # 4 steps of batch 2: samples 0, 1, 2, 0, 1, 2, 0, 1 -- the three fixed ones in turn
    assert drawn == [fixed[k % 3] for k in range(8)]
    assert len(set(fixed)) == 3


def test_a_run_resumed_with_a_position_table_starts_it_at_zero_and_learns_it(autoencoder, tmp_path):
    """--spatial-pos true on a run saved without it: the same weights plus a zero table (the same
    function), Adam restarted (its moments are numbered by parameter), and training moves the
    table; a file missing any other parameter is still refused."""
    import shutil

    from safetensors.torch import load_file, save_file

    from vidgen.models import CausalWanTransformer
    from vidgen.training.checkpoint import load_training_state

    _, final = autoencoder
    config = dict(autoencoder=str(final), lr=2e-3, warmup=5, save_every=10, **TINY_DIT)
    run = tmp_path / "run"
    train_transformer(TransformerTrainConfig(run_dir=str(run), steps=10, **config))
    saved = tmp_path / "saved"
    shutil.copytree(run, saved)
    before = load_file(str(saved / "latest" / "model.safetensors"))
    assert "spatial_pos" not in before and (saved / "latest" / "optimizer.safetensors").is_file()

    # what a resumed run loads: the saved weights, a zero table, no Adam moments
    grid = 32 // 4 // 2  # canvas / autoencoder factor / patch
    model = CausalWanTransformer(**{**TINY_DIT["model"], "spatial_pos_grid": (grid, grid)})
    optimizer = torch.optim.AdamW(model.parameters())
    state = load_training_state(saved, model=model, ema=None, optimizer=optimizer)
    assert state is not None and state["restart_warmup"] and not optimizer.state
    assert torch.equal(model.spatial_pos, torch.zeros_like(model.spatial_pos))
    torch.testing.assert_close(model.proj_out.weight, before["proj_out.weight"])

    # the run trains it
    train_transformer(TransformerTrainConfig(run_dir=str(run), steps=14, spatial_pos=True, **config))
    table = load_file(str(run / "latest" / "model.safetensors"))["spatial_pos"]
    assert table.shape == model.spatial_pos.shape and table.abs().max() > 0

    # the table at its own rate: --spatial-pos-lr-scale K moves it ~K times as far in the same
    # steps (Adam's step is ~lr whatever the gradient's size), without weight decay
    moved = {}
    for scale in (1.0, 10.0):
        branch = tmp_path / f"scale{scale:g}"
        shutil.copytree(saved, branch)
        train_transformer(
            TransformerTrainConfig(
                run_dir=str(branch), steps=14, spatial_pos=True, spatial_pos_lr_scale=scale, **config
            )
        )
        moved[scale] = load_file(str(branch / "latest" / "model.safetensors"))["spatial_pos"].abs().mean()
    assert 5.0 < moved[10.0] / moved[1.0] < 15.0, moved
    groups = json.loads((tmp_path / "scale10" / "latest" / "state.json").read_text())["optimizer"][
        "param_groups"
    ]
    assert [(g.get("lr_scale", 1.0), g["weight_decay"], len(g["params"])) for g in groups][1] == (
        10.0,
        0.0,
        1,
    )
    with pytest.raises(ValueError, match="positive"):
        train_transformer(
            TransformerTrainConfig(
                run_dir=str(tmp_path / "bad"), steps=1, spatial_pos=True, spatial_pos_lr_scale=0.0, **config
            )
        )

    # any other missing parameter is still an error
    del before["proj_out.weight"]
    save_file(before, str(saved / "latest" / "model.safetensors"))
    with pytest.raises(RuntimeError, match="proj_out.weight"):
        load_training_state(saved, model=model, ema=None, optimizer=None)


def test_guidance_distillation_target_is_the_flow_target_plus_the_teachers_guidance():
    """The loss regresses ``noise - latents + (s - 1) (teacher(caption) - teacher(no caption))``,
    and the term is zero for a sample whose caption was dropped."""
    from vidgen.attention import AttentionPattern
    from vidgen.models import CausalWanTransformer
    from vidgen.pipelines.scheduler import shift_sigma, timestep_of
    from vidgen.training.transformer import GuidanceTeacher, diffusion_forcing_loss

    torch.manual_seed(0)
    arch = {**TINY_DIT["model"]}
    student, teacher = CausalWanTransformer(**arch).eval(), CausalWanTransformer(**arch).eval()
    config = TransformerTrainConfig(**{k: v for k, v in TINY_DIT.items() if k != "model"}, model=arch)
    latents = torch.randn(3, 4, 8, 4, 4)
    text = torch.randn(3, 6, arch["text_dim"])
    uncond = torch.randn(1, 6, arch["text_dim"])
    text[2] = uncond[0]  # a dropped caption
    loss_chunks = torch.ones(3, 4, dtype=torch.bool)
    guidance = GuidanceTeacher(teacher, 2.5, uncond)

    with torch.no_grad():
        got = diffusion_forcing_loss(
            student, latents, text, loss_chunks, config, torch.Generator().manual_seed(3), None, guidance
        )
        plain = diffusion_forcing_loss(
            student, latents, text, loss_chunks, config, torch.Generator().manual_seed(3)
        )
        # the same draws by hand (clean_context_prob etc. as diffusion_forcing_loss makes them)
        g = torch.Generator().manual_seed(3)
        u = torch.rand(3, 4, generator=g)
        sigma = shift_sigma(u, config.sigma_shift)
        clean = torch.rand(3, generator=g) < config.clean_context_prob
        small = torch.rand(3, 4, generator=g) * config.context_sigma_max
        mask = torch.zeros(3, 4, dtype=torch.bool)
        mask[clean, :-1] = True
        sigma = torch.where(mask, small, sigma).repeat_interleave(2, dim=1)
        noise = torch.randn(latents.shape, generator=g)
        noisy = (1 - sigma[:, None, :, None, None]) * latents + sigma[:, None, :, None, None] * noise
        pattern = AttentionPattern.block_causal(4, 2)
        t = timestep_of(sigma)
        cond = teacher(noisy, t, text, attention_pattern=pattern, return_dict=False)[0]
        free = teacher(noisy, t, uncond.expand(3, -1, -1), attention_pattern=pattern, return_dict=False)[0]
        term = guidance.term(noisy, t, text, pattern)
        target = noise - latents + 1.5 * (cond - free)
        pred = student(noisy, t, text, attention_pattern=pattern, return_dict=False)[0]
        expected = (pred - target).square().mean()
    torch.testing.assert_close(term, 1.5 * (cond - free), rtol=1e-4, atol=1e-5)
    assert term[2].abs().max() == 0 and term[:2].abs().max() > 1e-3
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert abs(float(got) - float(plain)) > 1e-4


def test_guidance_distillation_trains_and_needs_a_teacher(autoencoder, tmp_path):

    _, final = autoencoder
    config = dict(autoencoder=str(final), lr=2e-3, warmup=5, save_every=10, **TINY_DIT)
    teacher = tmp_path / "teacher"
    train_transformer(TransformerTrainConfig(run_dir=str(teacher), steps=5, **config))
    with pytest.raises(ValueError, match="guidance-teacher"):
        train_transformer(
            TransformerTrainConfig(run_dir=str(tmp_path / "x"), steps=5, guidance_scale=2.0, **config)
        )
    run = tmp_path / "student"
    train_transformer(
        TransformerTrainConfig(
            run_dir=str(run),
            steps=10,
            guidance_scale=2.0,
            guidance_teacher=str(teacher),
            guidance_region="object",
            **config,
        )
    )
    losses = _losses(run)
    assert len(losses) == 2 and all(np.isfinite(losses))
    state = json.loads((run / "latest" / "state.json").read_text())
    assert state["config"]["guidance_scale"] == 2.0 and state["config"]["guidance_teacher"] == str(teacher)
    assert state["config"]["guidance_region"] == "object"
    _refused_by_train_cli(tmp_path / "y", "--guidance-scale", "2", named="--guidance-teacher")


@pytest.mark.slow
def test_a_compiled_guidance_teacher_gives_the_eager_term():
    from vidgen.attention import AttentionPattern
    from vidgen.models import CausalWanTransformer
    from vidgen.training.transformer import GuidanceTeacher

    torch.manual_seed(0)
    teacher = CausalWanTransformer(**TINY_DIT["model"])
    uncond = torch.randn(1, 6, TINY_DIT["model"]["text_dim"])
    eager = GuidanceTeacher(teacher, 1.5, uncond)
    compiled = GuidanceTeacher(teacher, 1.5, uncond, compile=True)
    noisy, t = torch.randn(2, 4, 8, 4, 4), torch.rand(2, 8) * 1000
    text = torch.randn(2, 6, TINY_DIT["model"]["text_dim"])
    pattern = AttentionPattern.block_causal(4, 2)
    expected = eager.term(noisy, t, text, pattern)
    got = compiled.term(noisy, t, text, pattern)
    assert compiled.forward is not teacher and expected.abs().max() > 1e-3
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_guidance_on_the_object_region_only_leaves_the_other_cells_the_flow_target():
    """``guidance_where``: the term is added on the marked latent cells only, so far from the
    object the regression target is the plain flow target (the background is not pushed)."""
    from vidgen.models import CausalWanTransformer
    from vidgen.training.transformer import GuidanceTeacher, diffusion_forcing_loss

    torch.manual_seed(0)
    arch = {**TINY_DIT["model"]}
    teacher = CausalWanTransformer(**arch).eval()
    config = TransformerTrainConfig(**{k: v for k, v in TINY_DIT.items() if k != "model"}, model=arch)
    latents = torch.randn(2, 4, 8, 4, 4)
    text = torch.randn(2, 6, arch["text_dim"])
    guidance = GuidanceTeacher(teacher, 3.0, torch.randn(1, 6, arch["text_dim"]))
    where = torch.zeros(2, 8, 4, 4, dtype=torch.bool)
    where[:, :, 1:3, 1:3] = True

    def student(noisy, timestep, text, attention_pattern=None, return_dict=False):
        return (torch.zeros_like(noisy),)

    def loss(teacher_term, region):
        return diffusion_forcing_loss(
            student,
            latents,
            text,
            torch.ones(2, 4, dtype=torch.bool),
            config,
            torch.Generator().manual_seed(5),
            None,
            teacher_term,
            region,
        )

    with torch.no_grad():
        plain = loss(None, None)
        everywhere, masked, nowhere = (
            loss(guidance, None),
            loss(guidance, where),
            loss(guidance, torch.zeros_like(where)),
        )
    # a zero student's loss is the mean square of its target
    torch.testing.assert_close(nowhere, plain)
    assert abs(float(masked) - float(plain)) > 1e-4 and abs(float(masked) - float(everywhere)) > 1e-4


@pytest.mark.parametrize(
    ("flags", "native"),
    [
        ("fpu sse2 avx avx2 fma", False),  # AVX2 only: bf16 is emulated
        ("avx2 avx512f avx512bw", False),  # AVX-512 without its BF16 extension
        ("avx2 avx512f avx512_bf16", True),
        ("avx2 amx_bf16 amx_tile", True),
    ],
)
def test_training_autocasts_to_bf16_only_where_the_cpu_has_it(tmp_path, monkeypatch, flags, native):
    """The default of ``--bf16`` follows the CPU's flags: emulated bf16 made steps 5x slower."""
    import vidgen.training.configs as configs
    from vidgen.config import cpu_has_native_bf16

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\nbugs\t\t: avx512_bf16\n")
    assert cpu_has_native_bf16(str(cpuinfo)) is native  # the flags line only, not "bugs"
    monkeypatch.setattr(configs, "cpu_has_native_bf16", lambda: native)
    assert TransformerTrainConfig().bf16 is native
    assert TransformerTrainConfig(bf16=True).bf16 is True  # asked for: kept
    assert cpu_has_native_bf16(str(tmp_path / "absent")) is False


def test_shape_swap_noises_the_other_shape_and_keeps_the_captioned_clip_as_the_target():
    """With ``shape_swap``, the swapped loss chunks at sigma >= ``shape_swap_sigma`` get
    ``(1 - s) other + s noise`` as input, and the target still recovers the captioned clip's
    latents (an oracle predicting them has zero loss); context chunks, low-sigma chunks and a run
    without the swap are untouched."""
    from vidgen.training.transformer import diffusion_forcing_loss

    torch.manual_seed(0)
    latents, other = torch.randn(4, 4, 8, 4, 4), torch.randn(4, 4, 8, 4, 4)
    text = torch.randn(4, 6, TINY_DIT["model"]["text_dim"])
    loss_chunks = torch.ones(4, 4, dtype=torch.bool)
    loss_chunks[3, :2] = False  # a sample whose first chunks are an old prompt's context
    base = {k: v for k, v in TINY_DIT.items() if k != "model"}
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def oracle(name):
        """Records its input; predicts the velocity whose clean estimate is ``latents``."""

        def model(noisy, timestep, text, attention_pattern=None, return_dict=False):
            sigma = (timestep / 1000.0)[:, None, :, None, None]
            seen[name] = (noisy.clone(), sigma)
            return ((noisy - latents) / sigma,)

        return model

    def loss(name, swap, threshold=0.0, other_shape=other):
        config = TransformerTrainConfig(**base, shape_swap=swap, shape_swap_sigma=threshold)
        generator = torch.Generator().manual_seed(5)
        return diffusion_forcing_loss(
            oracle(name), latents, text, loss_chunks, config, generator, other_shape_latents=other_shape
        )

    assert float(loss("plain", 0.0, other_shape=None)) < 1e-8
    assert float(loss("off", 0.0)) < 1e-8
    assert torch.equal(seen["off"][0], seen["plain"][0])  # swap 0: the same draws, the same input
    assert float(loss("all", 1.0)) < 1e-8  # the target's clean estimate is the captioned clip
    assert float(loss("high", 1.0, threshold=0.5)) < 1e-8

    plain, sigma = seen["plain"]
    sigma_chunks = sigma[:, 0, ::2, 0, 0]  # (B, chunks)
    context = sigma_chunks <= TransformerTrainConfig().context_sigma_max
    assert context[3, :2].all() and (~context).any()
    for name, threshold in (("all", 0.0), ("high", 0.5)):
        swapped = (~context & (sigma_chunks >= threshold)).repeat_interleave(2, dim=1)
        diff = seen[name][0] - plain
        expected = (1 - sigma) * (other - latents)
        for b in range(4):
            for f in range(8):
                if swapped[b, f]:
                    torch.testing.assert_close(diff[b, :, f], expected[b, :, f], rtol=1e-4, atol=1e-5)
                else:
                    assert diff[b, :, f].abs().max() == 0
    assert ((~context) & (sigma_chunks < 0.5)).any() and ((~context) & (sigma_chunks >= 0.5)).any()


def test_shape_swap_trains_and_swaps_only_captioned_samples(autoencoder, tmp_path, monkeypatch):
    """A run with ``shape_swap`` renders and encodes the other shape (no shape contrast asked) and
    hands the loss the other shape's latents for captioned samples, the clip's own for a sample
    whose caption was dropped (it names no shape to draw)."""
    calls = _train_recording_swaps(autoencoder, tmp_path, monkeypatch, shape_swap=1.0)
    kinds = set()
    for latents, swap, _, batch, _ in calls:
        for k, text in enumerate(s.text for s in batch):
            kinds.add(bool(text))
            same = torch.equal(swap[k], latents[k])
            assert same is not bool(text)  # captioned: another shape; dropped: the clip itself
    assert kinds == {True, False}


def test_shape_weights_draw_the_samples_shapes_in_proportion(autoencoder, tmp_path):
    """``shape_weights`` sets the shares of circles, squares and triangles among the samples (read
    back from their captions); an empty value keeps the uniform draw and its random stream; the CLI
    refuses a malformed value (exit 2, one line)."""

    from vidgen.shapes.prompts import parse_prompt

    _, final = autoencoder
    plain = dict(
        autoencoder=str(final), transition_prob=0.0, late_appearance_prob=0.0, gap_change_prob=0.0,
        caption_dropout=0.0, **TINY_DIT,
    )  # fmt: skip

    def shares(weights: str, count: int = 480) -> dict[str, float]:
        config = TransformerTrainConfig(shape_weights=weights, **plain)
        rng = np.random.default_rng(7)
        shapes = [parse_prompt(make_sample(rng, config).text).shape for _ in range(count)]
        return {s: shapes.count(s) / count for s in ("circle", "square", "triangle")}

    assert shares("0:0:1", 40) == {"circle": 0.0, "square": 0.0, "triangle": 1.0}
    skewed = shares("1:1:2")
    assert abs(skewed["triangle"] - 0.5) < 0.08 and abs(skewed["circle"] - 0.25) < 0.08, skewed  # ~3.5 sd
    uniform = shares("")
    assert abs(uniform["triangle"] - 1 / 3) < 0.08 and abs(uniform["circle"] - 1 / 3) < 0.08, uniform
    a = make_sample(np.random.default_rng(3), TransformerTrainConfig(**plain))
    b = make_sample(np.random.default_rng(3), TransformerTrainConfig(shape_weights="", **plain))
    np.testing.assert_array_equal(a.frames, b.frames)
    for bad in ("1:1", "1:-1:2", "0:0:0", "a:b:c"):
        with pytest.raises(ValueError, match="--shape-weights"):
            check_config(TransformerTrainConfig(shape_weights=bad, **plain))
    cli = _refused_by_train_cli(tmp_path / "y", "--shape-weights", "1:2", named="--shape-weights")
    assert len(cli.stderr.strip().splitlines()) == 1


def test_lag_swap_trains_on_lagging_copies_of_captioned_samples(autoencoder, tmp_path, monkeypatch):
    """A run with ``lag_swap`` 1 redraws every captioned sample with the object some frames behind
    (the same object: as many pixels, drawn elsewhere), hands the loss its latents as the swap for
    exactly those samples, forced; a dropped caption keeps its clip; with ``oversize_swap`` 1 too
    the oversize swap takes precedence. The CLI refuses a lag under one frame (exit 2, one line)."""

    calls = _train_recording_swaps(autoencoder, tmp_path, monkeypatch, lag_swap=1.0, lag_frames=8)
    kinds = set()
    for latents, swap, forced, batch, _ in calls:
        for k, sample in enumerate(batch):
            captioned = bool(sample.text)
            kinds.add(captioned)
            assert (sample.lag_frames is not None) is captioned and sample.oversize_frames is None
            assert bool(forced[k]) is captioned
            assert torch.equal(swap[k], latents[k]) is not captioned
            if captioned:
                background = sample.frames[:, :1, :1]
                drawn, lagged = (
                    (sample.frames != background).any(-1),
                    (sample.lag_frames != background).any(-1),
                )
                assert abs(int(lagged[-1].sum()) - int(drawn[-1].sum())) <= 0.15 * drawn[-1].sum() + 4
                assert not np.array_equal(sample.frames[-1], sample.lag_frames[-1])  # 4-8 frames behind
    assert kinds == {True, False}
    both = _train_recording_swaps(
        autoencoder, tmp_path / "both", monkeypatch, lag_swap=1.0, oversize_swap=1.0
    )  # fmt: skip
    for _, _, _, batch, _ in both:
        assert all(s.lag_frames is None and (s.oversize_frames is not None) is bool(s.text) for s in batch)
    cli = _refused_by_train_cli(
        tmp_path / "y", "--lag-swap", "0.5", "--lag-frames", "0", named="--lag-frames"
    )
    assert len(cli.stderr.strip().splitlines()) == 1


def test_own_context_estimates_each_chunk_against_the_estimates_before_it():
    """Chunk k of ``own_context_estimates`` is the one-step clean estimate of the clip's chunk k
    noised to its drawn level, by a full-length block-causal forward whose chunks before k are the
    earlier estimates at timestep 0 (what follows k cannot matter): within 1e-5. The last chunk
    stays the clip's, and the levels fall in the configured range."""
    from vidgen.attention import AttentionPattern
    from vidgen.models import CausalWanTransformer
    from vidgen.pipelines.scheduler import timestep_of
    from vidgen.training.transformer import own_context_estimates

    torch.manual_seed(2)
    model = CausalWanTransformer(**TINY_DIT["model"]).eval()
    base = {k: v for k, v in TINY_DIT.items() if k != "model"}
    config = TransformerTrainConfig(
        **base, self_context=1.0, self_context_sigma_min=0.4, self_context_sigma_max=0.7
    )
    latents = torch.randn(2, TINY_DIT["model"]["in_channels"], 8, 4, 4)
    text = torch.randn(2, 6, TINY_DIT["model"]["text_dim"])
    out = own_context_estimates(model, latents, text, config, torch.Generator().manual_seed(5))

    generator = torch.Generator().manual_seed(5)  # the function's draws, in its order
    sigma = 0.4 + 0.3 * torch.rand(2, 3, generator=generator)
    noise = torch.randn(2, latents.shape[1], 6, 4, 4, generator=generator)
    assert torch.equal(out[:, :, 6:], latents[:, :, 6:])
    pattern = AttentionPattern.block_causal(4, 2)
    for k in range(3):
        s = sigma[:, k, None, None, None, None]
        noisy = (1 - s) * latents[:, :, 2 * k : 2 * k + 2] + s * noise[:, :, 2 * k : 2 * k + 2]
        junk = torch.randn(2, latents.shape[1], 8 - 2 * k - 2, 4, 4)  # after chunk k: irrelevant
        x = torch.cat([out[:, :, : 2 * k], noisy, junk], dim=2)
        levels = torch.zeros(2, 8)
        levels[:, 2 * k : 2 * k + 2] = sigma[:, k, None]
        levels[:, 2 * k + 2 :] = 0.9
        with torch.no_grad():
            pred = model(x, timestep_of(levels), text, attention_pattern=pattern, return_dict=False)[0]
        expected = noisy - s * pred[:, :, 2 * k : 2 * k + 2]
        torch.testing.assert_close(out[:, :, 2 * k : 2 * k + 2], expected, rtol=1e-5, atol=1e-5)
        assert (out[:, :, 2 * k : 2 * k + 2] - latents[:, :, 2 * k : 2 * k + 2]).abs().max() > 1e-3


def test_own_context_puts_the_estimates_in_the_context_and_leaves_them_out_of_the_loss():
    """For the marked samples the context chunks' inputs are the estimates, noised as a clean
    context is (sigma <= ``context_sigma_max``, the same noise); the last chunk's input and the
    unmarked samples are untouched; the estimated chunks leave the loss: a model exact on the last
    chunk and far off on the context loses nothing when every sample is marked."""
    from vidgen.training.transformer import diffusion_forcing_loss

    torch.manual_seed(3)
    latents = torch.randn(2, 4, 8, 4, 4)
    estimates = latents.clone()
    estimates[:, :, :6] += torch.randn(2, 4, 6, 4, 4)
    text = torch.randn(2, 6, TINY_DIT["model"]["text_dim"])
    base = {k: v for k, v in TINY_DIT.items() if k != "model"}
    config = TransformerTrainConfig(**base, clean_context_prob=0.0)  # no sample draws a clean context
    seen = {}

    def model_exact_on_the_last_chunk(name):
        def model(noisy, timestep, text, attention_pattern=None, return_dict=False):
            sigma = (timestep / 1000.0)[:, None, :, None, None]
            seen[name] = (noisy.clone(), sigma)
            pred = (noisy - latents) / sigma  # the flow target where the input is the clip's
            pred[:, :, :6] = 100.0
            return (pred,)

        return model

    def loss(name, own):
        return diffusion_forcing_loss(
            model_exact_on_the_last_chunk(name), latents, text, torch.ones(2, 4, dtype=torch.bool), config,
            torch.Generator().manual_seed(4), own_context=own, context_latents=None if own is None else estimates,
        )  # fmt: skip

    assert float(loss("plain", None)) > 1000
    assert float(loss("both", torch.tensor([True, True]))) < 1e-8
    assert float(loss("first", torch.tensor([True, False]))) > 1000  # sample 1's context still counts
    plain, sigma = seen["plain"]
    noise = (plain - (1 - sigma) * latents) / sigma  # the draw every run shares
    noisy, s = seen["first"]
    assert torch.equal(noisy[1], plain[1]) and torch.equal(noisy[0, :, 6:], plain[0, :, 6:])
    assert float(s[0, 0, :6].max()) <= config.context_sigma_max < float(sigma[0, 0, :6].min())
    expected = (1 - s[0, :, :6]) * estimates[0, :, :6] + s[0, :, :6] * noise[0, :, :6]
    torch.testing.assert_close(noisy[0, :, :6], expected, rtol=1e-4, atol=1e-4)


def test_self_context_trains_on_own_estimates_of_captioned_samples(autoencoder, tmp_path, monkeypatch):
    """A run with ``self_context`` 1 marks exactly the captioned samples without a prompt change,
    hands the loss the model's estimates (the clip's latents on the last chunk, others elsewhere),
    and trains to a finite loss. The CLI refuses a noise range outside [0, 1) (exit 2, one line)."""

    calls = _train_recording_swaps(autoencoder, tmp_path, monkeypatch, self_context=1.0)
    kinds = set()
    for latents, _, _, batch, kwargs in calls:
        marked = [bool(s.text) and all(s.loss_chunks) for s in batch]
        assert [s.own_context for s in batch] == marked
        kinds.update(marked)
        if not any(marked):
            assert kwargs["own_context"] is None
            continue
        assert kwargs["own_context"].tolist() == marked
        estimates = kwargs["context_latents"]
        assert torch.equal(estimates[:, :, -2:], latents[:, :, -2:])
        assert (estimates[:, :, :-2] - latents[:, :, :-2]).abs().amax(dim=(1, 2, 3, 4)).min() > 1e-3
    assert kinds == {True, False}
    cli = _refused_by_train_cli(
        tmp_path / "y",
        "--self-context",
        "0.5",
        "--self-context-sigma-max",
        "1.0",
        named="--self-context-sigma",
    )
    assert len(cli.stderr.strip().splitlines()) == 1


def test_turn_swap_sets_off_the_same_object_in_another_direction(autoencoder, tmp_path, monkeypatch):
    """A run with ``turn_swap`` 1 gives every captioned sample that names a direction and starts at
    the clip's start a clip of the same object from the same place (frame 0 equal) moving another
    way (later frames differ, as many object pixels), hands its latents to the loss as a forced
    swap; the rest keep their clip. The samples' draws honour the same conditions over 300 draws."""
    from vidgen.shapes.prompts import parse_prompt

    calls = _train_recording_swaps(autoencoder, tmp_path, monkeypatch, turn_swap=1.0)
    turned = 0
    for latents, swap, forced, batch, _ in calls:
        for k, sample in enumerate(batch):
            assert (forced is not None and bool(forced[k])) is (sample.turned_frames is not None)
            if sample.turned_frames is None:
                continue
            assert not torch.equal(swap[k], latents[k])
            turned += 1
            assert sample.text and parse_prompt(sample.text).direction is not None
            assert np.array_equal(sample.turned_frames[0], sample.frames[0])
            assert not np.array_equal(sample.turned_frames[-1], sample.frames[-1])
            background = sample.frames[:, :1, :1]
            drawn = (sample.frames != background).any(-1).sum(axis=(1, 2))
            moved = (sample.turned_frames != background).any(-1).sum(axis=(1, 2))
            assert np.abs(moved - drawn).max() <= 0.15 * drawn.max() + 4
    assert turned > 0
    base = {k: v for k, v in TINY_DIT.items() if k != "model"}
    config = TransformerTrainConfig(**base, turn_swap=1.0)
    rng = np.random.default_rng(0)
    samples = [make_sample(rng, config) for _ in range(300)]
    for sample in samples:
        if sample.turned_frames is not None:
            assert parse_prompt(sample.text).direction is not None and all(sample.loss_chunks)
    named = [s for s in samples if s.text and parse_prompt(s.text).direction and all(s.loss_chunks)]
    # gap 0 is drawn 30 % of the time: about that share of the eligible samples turn
    share = sum(s.turned_frames is not None for s in named) / len(named)
    assert 0.15 < share < 0.45
    with pytest.raises(ValueError, match="--turn-swap"):
        check_config(TransformerTrainConfig(**base, turn_swap=1.5))


def test_direction_contrast_weights_the_values_that_tell_the_directions_apart(
    autoencoder, tmp_path, monkeypatch
):
    """A run with ``direction_contrast`` (object weight off) renders, for exactly the captioned
    samples that name a direction and show a clip's start, the object from the same start moving
    another way, and weights the loss by ``1 + strength * |z - z'|`` against its latents: level on
    latent frame 0 (the same frame), above it where the paths part, and flat (the batch's scale) on
    the other samples. About the share of eligible samples that start at the clip's start has one."""
    from vidgen.shapes.prompts import parse_prompt

    calls = _train_recording_swaps(
        autoencoder, tmp_path, monkeypatch, direction_contrast=4.0, object_weight=0.0
    )
    turned = 0
    for _, _, _, batch, kwargs in calls:
        weight = kwargs["object_weight"]
        if all(s.other_direction_frames is None for s in batch):
            assert weight is None
            continue
        assert weight.mean().item() == pytest.approx(1.0, rel=1e-5)
        level = weight.amin().item()  # the weight of 1 after the batch's scaling
        for k, sample in enumerate(batch):
            if sample.other_direction_frames is None:
                torch.testing.assert_close(weight[k], torch.full_like(weight[k], level))
                continue
            turned += 1
            assert sample.text and parse_prompt(sample.text).direction is not None and all(sample.loss_chunks)
            assert np.array_equal(sample.other_direction_frames[0], sample.frames[0])
            assert not np.array_equal(sample.other_direction_frames[-1], sample.frames[-1])
            torch.testing.assert_close(
                weight[k, :, 0], torch.full_like(weight[k, :, 0], level), atol=1e-3, rtol=1e-3
            )
            assert weight[k, :, 1:].amax().item() > 1.5 * level
    assert turned > 0
    base = {k: v for k, v in TINY_DIT.items() if k != "model"}
    rng = np.random.default_rng(0)
    samples = [make_sample(rng, TransformerTrainConfig(**base, direction_contrast=4.0)) for _ in range(300)]
    named = [s for s in samples if s.text and parse_prompt(s.text).direction and all(s.loss_chunks)]
    assert {id(s) for s in samples if s.other_direction_frames is not None} <= {id(s) for s in named}
    share = sum(s.other_direction_frames is not None for s in named) / len(named)
    assert 0.15 < share < 0.45  # gap 0 is drawn 30 % of the time
    with pytest.raises(ValueError, match="--direction-contrast"):
        check_config(TransformerTrainConfig(**base, direction_contrast=-1.0))


def test_false_start_holds_or_drifts_the_first_chunk_then_sets_off_the_captions_way():
    """``false_start``: only captioned samples that name a direction and show a clip's start get
    one (about the share that starts there). Its first chunk (video frames 0-4) holds the object
    still or drifts it another way; from frame 4 on the object moves the caption's way at its
    speed, in frames and masks alike. A drifting first chunk leaves the loss, a still one stays; the
    other start-of-clip draws (direction contrast) skip these samples; shares out of 0-1 raise."""
    from vidgen.shapes import world
    from vidgen.shapes.prompts import parse_prompt

    base = {k: v for k, v in TINY_DIT.items() if k != "model"}
    config = TransformerTrainConfig(**base, false_start=1.0, shape_contrast=4.0, direction_contrast=4.0)
    size = config.size
    grid = np.arange(size, dtype=np.float64)

    def centroid(mask):
        return np.array([(mask * grid[None, :]).sum(), (mask * grid[:, None]).sum()]) / mask.sum()

    rng = np.random.default_rng(5)
    samples = [make_sample(rng, config) for _ in range(300)]
    kinds = {"still": 0, "drift": 0}
    for sample in samples:
        if sample.false_start is None:
            continue
        kinds[sample.false_start] += 1
        spec = parse_prompt(sample.text)
        assert spec.direction is not None and sample.other_direction_frames is None
        scene = world.Scene(
            "black", "red", "circle", spec.size or "small", spec.speed or "slow", spec.direction
        )
        step = np.asarray(scene.velocity) * size  # pixels a frame, the caption's way
        paths = [centroid(m) for m in sample.masks]
        # from frame 4 (the first chunk's last) the caption's way: no wall within a second of the start
        np.testing.assert_allclose(paths[16] - paths[4], 12 * step, atol=0.05)
        early = paths[4] - paths[0]
        if sample.false_start == "still":
            assert all(sample.loss_chunks)
            np.testing.assert_allclose(early, 0.0, atol=1e-9)  # the masks hold too
            for t in range(1, 5):
                np.testing.assert_array_equal(sample.frames[t], sample.frames[0])
                np.testing.assert_array_equal(sample.other_shape_frames[t], sample.other_shape_frames[0])
        else:
            assert sample.loss_chunks == [False] + [True] * (len(sample.loss_chunks) - 1)
            assert np.abs(early).max() > 0.1 and np.abs(early - 4 * step).max() > 0.5  # moved, not so
    assert kinds["still"] > 5 and kinds["drift"] > 5
    named = [s for s in samples if s.text and parse_prompt(s.text).direction and all(s.loss_chunks[1:])]
    share = sum(s.false_start is not None for s in named) / len(named)
    assert 0.15 < share < 0.45  # gap 0 is drawn 30 % of the time
    for bad in ({"false_start": 1.5}, {"false_start_still": -0.1}):
        with pytest.raises(ValueError, match="--false-start"):
            check_config(TransformerTrainConfig(**base, **bad))


def test_bounce_focus_starts_clips_where_the_object_bounces_in_the_target_chunk():
    """``bounce_focus``: a plain sample's clip starts where its object turns at a wall in the target
    chunk, read off the masks' centroids, far more often than in an unfocused draw of samples; ``bounce_start`` returns a start the spec
    allows whose path turns from ``first`` on, or None where no start can (a slow object within its
    first second); a share out of 0-1 raises."""
    from vidgen.shapes import world
    from vidgen.training.transformer import bounce_start, turn_frames

    base = {k: v for k, v in TINY_DIT.items() if k != "model"}
    grid = np.arange(base.get("size", 64), dtype=np.float64)

    def turns_late(sample) -> bool:
        # the target chunk's frames, and the frame before them: contiguous in the clip
        frames = base.get("chunk_frames", 2) * 4 + 1
        masks = sample.masks[-frames:]
        path = np.array([[(m * grid[None, :]).sum(), (m * grid[:, None]).sum()] / m.sum() for m in masks])
        steps = np.diff(path, axis=0)
        for axis in (0, 1):
            signs = np.sign(steps[np.abs(steps[:, axis]) > 0.05, axis])  # under 0.05 px: still
            if (signs[1:] != signs[:-1]).any():
                return True
        return False

    def late_share(focus: float) -> float:
        config = TransformerTrainConfig(**{**base, "max_gap": 40}, bounce_focus=focus)
        rng = np.random.default_rng(3)
        samples = [make_sample(rng, config) for _ in range(200)]
        plain = [s for s in samples if all(s.loss_chunks) and s.text == s.previous_text]
        return sum(map(turns_late, plain)) / len(plain)

    unfocused, focused = late_share(0.0), late_share(1.0)
    # about 0.23 and 0.75 (a third of the samples start at the clip's start, where only a fast
    # object can reach a wall by the target chunk)
    assert unfocused < 0.3 and focused > 0.65, (unfocused, focused)

    rng = np.random.default_rng(0)
    fast = world.Scene("black", "red", "square", "large", "fast", "down-right")
    for _ in range(20):
        start = bounce_start(rng, fast, 60, 40)
        assert start is not None
        (x_lo, x_hi), (y_lo, y_hi) = world.start_range(fast)
        assert x_lo <= start[0] <= x_hi and y_lo <= start[1] <= y_hi
        _, velocity = world.trajectory(fast, 60, start)
        assert (turn_frames(velocity) >= 40).any()
        clip = world.render_clip(fast, 60, start=start)
        np.testing.assert_allclose(clip.velocity, velocity)
    slow = fast.replace(speed="slow")
    assert bounce_start(rng, slow, world.FPS + 1, world.FPS) is None  # a second's travel from any start
    with pytest.raises(ValueError, match="--bounce-focus"):
        check_config(TransformerTrainConfig(**base, bounce_focus=1.2))


def test_wall_hold_holds_the_object_where_it_bounces_then_the_target_shows_it_leaving():
    """``wall_hold``: a plain sample's object stops where it bounces in the window for 4-12 frames
    (its mask unchanged frame to frame), at a wall (within a step of rule 8's bounce zone's inner
    edge: its box touches the wall within a step), then moves on along its path reversed on that
    axis: the target chunk shows it leaving. The chunks that show it held leave the loss, the
    others stay; a share out of 0-1 raises."""
    base = {k: v for k, v in TINY_DIT.items() if k != "model"}
    config = TransformerTrainConfig(**{**base, "max_gap": 40}, wall_hold=1.0)
    size = config.size
    grid = np.arange(size, dtype=np.float64)
    chunk = 4 * config.chunk_frames  # video frames per chunk after the first

    def centroid(mask):
        return np.array([(mask * grid[None, :]).sum(), (mask * grid[:, None]).sum()]) / mask.sum()

    rng = np.random.default_rng(7)
    samples = [make_sample(rng, config) for _ in range(120)]
    held = [s for s in samples if s.wall_hold]
    assert len(held) > 20
    for sample in held:
        still = np.array(
            [np.array_equal(a, b) for a, b in zip(sample.masks[1:], sample.masks[:-1], strict=True)]
        )
        runs = np.flatnonzero(still)
        assert len(runs) == sample.wall_hold and np.all(np.diff(runs) == 1)  # one hold, as long as asked
        first, last = runs[0], runs[-1] + 1  # frames first .. last show the same object
        # chunk 0 is frame 0 and the next latent frame's 4; chunk k >= 1 the next ``chunk`` frames each
        chunk_of = [0 if t <= 4 else 1 + (t - 5) // chunk for t in range(len(sample.masks))]
        showing = {chunk_of[t] for t in range(first + 1, last + 1)}
        assert sample.loss_chunks == [k not in showing for k in range(len(sample.loss_chunks))]
        assert sample.loss_chunks[-1]  # the target is learned
        path = np.array([centroid(m) for m in sample.masks])
        before = path[first] - path[first - 2]
        after = path[-1] - path[last]
        # on the axis it bounced, it leaves the wall it had reached
        axis = int(np.argmax([abs(before[a]) * (before[a] * after[a] < 0) for a in (0, 1)]))
        assert before[axis] * after[axis] < 0, (before, after)
        wall_gap = path[first][axis] if before[axis] < 0 else size - path[first][axis]
        assert wall_gap < sample.masks[first].any(axis=1 - axis).sum() / 2 + 2.5  # touching, within a step
    with pytest.raises(ValueError, match="--wall-hold"):
        check_config(TransformerTrainConfig(**base, wall_hold=-0.5))


def test_direction_pairs_differ_only_in_the_direction():
    """``make_direction_pair``: the same object from the same place (frame 0 equal), setting off two
    different ways (the last frames differ), under captions that parse to the same prompt but for
    the direction, each naming its clip's direction."""
    from vidgen.shapes.prompts import parse_prompt
    from vidgen.training.transformer import make_direction_pair

    base = {k: v for k, v in TINY_DIT.items() if k != "model"}
    config = TransformerTrainConfig(run_dir="unused", autoencoder="unused", **base)
    rng = np.random.default_rng(3)
    latent_frames = config.sink_frames + config.window_frames + config.chunk_frames
    for _ in range(40):
        pair = make_direction_pair(rng, config)
        assert len(pair.frames) == len(pair.turned_frames) == 1 + 4 * (latent_frames - 1)
        assert np.array_equal(pair.frames[0], pair.turned_frames[0])
        assert not np.array_equal(pair.frames[-1], pair.turned_frames[-1])
        spec, turned = parse_prompt(pair.text), parse_prompt(pair.turned_text)
        assert spec.direction is not None and turned.direction is not None
        assert spec.direction != turned.direction
        assert dataclasses.replace(turned, direction=spec.direction) == spec


def test_direction_pair_loss_scores_the_difference_of_the_two_predictions():
    """The pair term, with stand-ins for the model that know the clips: both halves get one input
    and each its own caption; clean estimates that are the two clips score 0, and off by half their
    difference 0.25; any prediction made from the input alone (it cannot tell the halves apart)
    scores 1."""
    from vidgen.pipelines.scheduler import NUM_TRAIN_TIMESTEPS
    from vidgen.training.transformer import direction_pair_loss

    base = {k: v for k, v in TINY_DIT.items() if k != "model"}
    config = TransformerTrainConfig(run_dir="unused", autoencoder="unused", model=TINY_DIT["model"], **base)
    pairs, frames = 3, config.sink_frames + config.window_frames + config.chunk_frames
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(pairs, 8, frames, 4, 4, generator=gen)
    z_turned = z + torch.randn(z.shape, generator=gen) * (torch.rand(z.shape, generator=gen) < 0.1)
    text, turned_text = torch.randn(pairs, 5, 7, generator=gen), torch.randn(pairs, 5, 7, generator=gen)
    both = torch.cat([z, z_turned])
    seen = []

    def exact(offset):
        """Stand-in that returns each half's target, plus ``offset``."""

        def forward(noisy, timestep, embedded, **_):
            s = (timestep / NUM_TRAIN_TIMESTEPS)[:, None, :, None, None]
            seen.append((noisy, s, embedded))
            return ((noisy - both - offset) / s,)  # clean estimate: its half's clip, plus offset

        return forward

    for offset, expected in ((0.0, 0.0), (torch.cat([torch.zeros_like(z), 0.5 * (z_turned - z)]), 0.25)):
        loss = direction_pair_loss(
            exact(offset), z, z_turned, text, turned_text, config, torch.Generator().manual_seed(1)
        )
        noisy, s, embedded = seen[-1]
        assert torch.equal(noisy[:pairs], noisy[pairs:])
        # the input is the clips' mean noised (the noise drawn after the levels, from the generator)
        drawn = torch.Generator().manual_seed(1)
        torch.rand(pairs, frames // config.chunk_frames, generator=drawn)
        noise = torch.randn(z.shape, generator=drawn)
        torch.testing.assert_close(noisy[:pairs], (1 - s[:pairs]) * (z + z_turned) / 2 + s[:pairs] * noise)
        torch.testing.assert_close(embedded, torch.cat([text, turned_text]))
        assert loss.item() == pytest.approx(expected, abs=1e-5)
    # the levels mapped onto [direction_pair_sigma_min, 1]: all at or above it, spread across it
    high = dataclasses.replace(config, direction_pair_sigma_min=0.7)
    direction_pair_loss(exact(0.0), z, z_turned, text, turned_text, high, torch.Generator().manual_seed(1))
    levels = seen[-1][1]
    assert levels.min().item() >= 0.7 and levels.max().item() - levels.min().item() > 0.1
    for blind in (torch.ones_like, lambda noisy: noisy.square() - 3 * noisy):
        assert direction_pair_loss(
            lambda noisy, *a, f=blind, **k: (f(noisy),), z, z_turned, text, turned_text, config, gen
        ).item() == pytest.approx(1.0, abs=1e-6)


def test_direction_pairs_train_and_log_their_term(autoencoder, tmp_path):
    """A tiny run with ``direction_pairs`` trains, logs the pair term (finite, near 1 for a model
    that has not learned the direction), and the config refuses a negative count or weight."""
    _, final = autoencoder
    run = tmp_path / "run"
    config = dict(autoencoder=str(final), lr=2e-3, warmup=2, save_every=10, steps=5, **TINY_DIT)
    train_transformer(TransformerTrainConfig(run_dir=str(run), direction_pairs=2, **config))
    lines = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    pair = [line["pair"] for line in lines if "pair" in line]
    assert len(pair) == 1 and 0.2 < pair[0] < 5.0
    base = {k: v for k, v in TINY_DIT.items() if k != "model"}
    for bad in ({"direction_pairs": -1}, {"direction_pair_weight": -0.5}, {"direction_pair_sigma_min": 1.0}):
        with pytest.raises(ValueError, match="--direction-pair"):
            check_config(TransformerTrainConfig(**base, **bad))


def test_sample_workers_draw_each_sample_from_its_own_stream():
    """Worker processes give every step the samples of its (seed, step, index) streams, in index
    order, however many workers there are and however the batch is split among them."""
    from vidgen.training.transformer import OBJECT_COVERAGE, SampleWorkers, latent_object_weight, sample_rng

    config = TransformerTrainConfig(
        batch_size=5, data_workers=2, shape_contrast=4, direction_contrast=4, seed=3
    )
    workers = SampleWorkers(config, ahead=1, per_task=2)
    try:
        got = {step: workers.take(step) for step in (7, 8, 10)}
    finally:
        workers.close()
    one = SampleWorkers(dataclasses.replace(config, data_workers=1), ahead=0, per_task=5)
    try:
        alone = one.take(8)
    finally:
        one.close()
    for step, samples in got.items():
        wanted = [make_sample(sample_rng(config, step, i), config) for i in range(5)]
        assert [s.text for s in samples] == [w.text for w in wanted]
        for s, w in zip(samples, wanted):
            np.testing.assert_array_equal(s.frames, w.frames)
            np.testing.assert_array_equal(s.other_shape_frames, w.other_shape_frames)
            np.testing.assert_array_equal(s.masks, w.masks > OBJECT_COVERAGE)  # sent as booleans

        # ... which weight the same latent cells as the coverage does
        def weight(m):
            return latent_object_weight(torch.from_numpy(np.stack(m).astype(np.float32)), 4, 8, 8.0)

        assert torch.equal(weight([s.masks for s in samples]), weight([w.masks for w in wanted]))
        assert weight([w.masks for w in wanted]).gt(1).any()
    assert [s.text for s in alone] == [s.text for s in got[8]]
    np.testing.assert_array_equal(alone[4].frames, got[8][4].frames)
    # distinct streams: no two samples of a step, nor one index across steps, repeat
    assert len({s.frames.tobytes() for s in got[7]} | {got[8][0].frames.tobytes()}) == 6


def test_clips_to_tensor_converts_a_batch_as_clip_to_tensor_converts_each():
    from vidgen.training.data import clip_to_tensor, clips_to_tensor

    clips = [np.random.default_rng(k).integers(0, 256, (5, 8, 8, 3), dtype=np.uint8) for k in range(3)]
    batch = clips_to_tensor(clips)
    assert batch.shape == (3, 3, 5, 8, 8) and batch.dtype == torch.float32
    torch.testing.assert_close(batch, torch.stack([clip_to_tensor(c) for c in clips]), rtol=0, atol=0)


def test_a_run_with_data_workers_resumes_exactly_whatever_the_workers(autoencoder, tmp_path):
    """The batch of a step is the same with one worker or two, and a stretch that stops with
    steps prefetched resumes where it stopped."""
    _, final = autoencoder
    config = dict(autoencoder=str(final), lr=2e-3, warmup=2, save_every=2, steps=4, **TINY_DIT)
    two = tmp_path / "two"
    train_transformer(TransformerTrainConfig(run_dir=str(two), data_workers=2, **config))
    split = tmp_path / "split"
    for _ in range(2):
        train_transformer(
            TransformerTrainConfig(run_dir=str(split), data_workers=1, stretch_steps=2, **config)
        )
    plain = tmp_path / "plain"
    train_transformer(TransformerTrainConfig(run_dir=str(plain), **config))
    from safetensors.torch import load_file

    a, b, c = (load_file(str(d / "latest" / "model.safetensors")) for d in (two, split, plain))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)  # per-sample streams: other data than in-process


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_loss_on_cuda_is_the_loss_on_the_cpu():
    """The same weights, batch and generator seed give the same loss on the GPU as on the CPU:
    every draw comes from the CPU generator (fp32 matmuls, no TF32: within 1e-4)."""
    from tests.tiny import TINY_TRANSFORMER as arch
    from vidgen.models import CausalWanTransformer
    from vidgen.training.transformer import diffusion_forcing_loss, own_context_estimates

    config = TransformerTrainConfig(model={**arch, "rope_max_seq_len": 32}, shape_swap=0.5, self_context=0.5)
    torch.manual_seed(0)
    model = CausalWanTransformer(**config.model)
    latents = torch.randn(3, arch["in_channels"], 6, 4, 4)
    other = torch.randn_like(latents)
    text = torch.randn(3, 8, arch["text_dim"])
    loss_chunks = torch.tensor([[True] * 3, [False, True, True], [True] * 3])
    weight = torch.rand(3, 6, 4, 4) + 0.5
    own = torch.tensor([True, False, True])
    losses = []
    for device in ("cpu", "cuda"):
        m = model.to(device)
        args = [t.to(device) for t in (latents, text, loss_chunks)]
        context = own_context_estimates(m, args[0], args[1], config, torch.Generator().manual_seed(5))
        loss = diffusion_forcing_loss(
            m,
            *args,
            config,
            torch.Generator().manual_seed(7),
            weight.to(device),
            other_shape_latents=other.to(device),
            own_context=own.to(device),
            context_latents=context,
        )
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_run_on_cuda_with_data_workers_trains(autoencoder, tmp_path):
    _, final = autoencoder
    run = tmp_path / "cuda"
    config = dict(autoencoder=str(final), lr=2e-3, warmup=5, save_every=10, steps=20, **TINY_DIT)
    train_transformer(TransformerTrainConfig(run_dir=str(run), device="cuda", data_workers=2, **config))
    losses = _losses(run)
    assert len(losses) == 4 and losses[-1] < losses[0]


def test_a_run_resumed_with_text_modulation_starts_it_at_zero_and_learns_it(autoencoder, tmp_path):
    """--text-modulation true on a run saved without it: the same weights plus a zero map (the
    same function), Adam restarted, and training moves the map; the exported config carries it."""
    from safetensors.torch import load_file

    from vidgen.models import CausalWanTransformer
    from vidgen.training.checkpoint import load_training_state

    _, final = autoencoder
    config = dict(autoencoder=str(final), lr=2e-3, warmup=5, save_every=10, **TINY_DIT)
    run = tmp_path / "run"
    train_transformer(TransformerTrainConfig(run_dir=str(run), steps=10, **config))
    before = load_file(str(run / "latest" / "model.safetensors"))
    assert not any(k.startswith("text_to_modulation") for k in before)
    model = CausalWanTransformer(**{**TINY_DIT["model"], "text_modulation": True})
    optimizer = torch.optim.AdamW(model.parameters())
    state = load_training_state(run, model=model, ema=None, optimizer=optimizer)
    assert state is not None and state["restart_warmup"] and not optimizer.state
    assert not model.text_to_modulation.weight.any() and not model.text_to_modulation.bias.any()

    train_transformer(TransformerTrainConfig(run_dir=str(run), steps=14, text_modulation=True, **config))
    after = load_file(str(run / "latest" / "model.safetensors"))
    assert after["text_to_modulation.weight"].abs().max() > 0
    saved = json.loads((run / "latest" / "config.json").read_text())
    assert saved["text_modulation"] is True
    # its rate changed on a saved run: the groups differ, so Adam restarts rather than failing
    train_transformer(
        TransformerTrainConfig(
            run_dir=str(run), steps=16, text_modulation=True, text_modulation_lr_scale=10, **config
        )
    )
    assert json.loads((run / "latest" / "state.json").read_text())["step"] == 16

    # at its own rate: --text-modulation-lr-scale K moves it ~K times as far in the same steps

    moved = {}
    for scale in (1.0, 10.0):
        branch = tmp_path / f"scale{scale:g}"
        train_transformer(TransformerTrainConfig(run_dir=str(branch), steps=10, **config))
        train_transformer(
            TransformerTrainConfig(
                run_dir=str(branch), steps=14, text_modulation=True, text_modulation_lr_scale=scale, **config
            )
        )
        moved[scale] = (
            load_file(str(branch / "latest" / "model.safetensors"))["text_to_modulation.weight"].abs().mean()
        )
    assert 5.0 < moved[10.0] / moved[1.0] < 15.0, moved


def test_caption_velocities_are_the_named_way_at_the_named_speed_in_latent_cells():
    from vidgen.training.transformer import caption_velocities

    config = TransformerTrainConfig(
        size=64
    )  # 4x autoencoder, patch 2: 8 cells a side, 4 frames a latent frame
    got = caption_velocities(
        [
            "a large fast red circle moving left on a black background",
            "a small blue square moving up-right on a white background",
            "A Green Triangle Drifting Slowly Downward Over A Beige Backdrop",
            "a red circle moving on a black background",  # no direction named
            "",  # a dropped caption
        ],
        config,
        temporal=4,
        spatial=4,
    )
    cells = 64 / 8 * 4  # cells of the grid per canvas, times frames per latent frame
    diagonal = 0.5**0.5
    expected = torch.tensor(
        [
            [0.0, -0.025 * cells],  # (rows, columns): left is minus columns, fast
            [-0.010 * cells * diagonal, 0.010 * cells * diagonal],  # up is minus rows; default speed slow
            [0.010 * cells, 0.0],
            [0.0, 0.0],
            [0.0, 0.0],
        ]
    )
    torch.testing.assert_close(got, expected)


def test_a_run_with_text_velocity_trains_the_gains_and_logs_the_velocity_term(autoencoder, tmp_path):
    """--text-velocity true on a run saved without it: the velocity term is logged every step, the
    gains leave zero (the attention's gradient reaches them) and the saved config carries the flag;
    with --text-velocity-weight 0 there is no term."""
    from safetensors.torch import load_file

    _, final = autoencoder
    config = dict(autoencoder=str(final), lr=2e-3, warmup=5, save_every=10, **{**TINY_DIT, "log_every": 1})
    run = tmp_path / "run"
    train_transformer(TransformerTrainConfig(run_dir=str(run), steps=4, **config))
    train_transformer(
        TransformerTrainConfig(
            run_dir=str(run), steps=12, text_velocity=True, text_velocity_lr_scale=3, **config
        )
    )
    logged = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert len([r["vel"] for r in logged if "vel" in r]) == 8
    after = load_file(str(run / "latest" / "model.safetensors"))
    assert after["velocity_gain"].abs().max() > 0
    assert json.loads((run / "latest" / "config.json").read_text())["text_velocity"] is True
    train_transformer(
        TransformerTrainConfig(
            run_dir=str(run), steps=14, text_velocity=True, text_velocity_weight=0, **config
        )
    )
    logged = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "vel" in r][-1] == 12


def test_text_velocity_pooling_learns_the_named_way_from_held_out_phrasings():
    """The pooling over MiniLM's tokens, fitted to the captions' velocities (training phrasings),
    gives the named way's sign on >= 90 % of the named axes of held-out phrasings; a mean over the
    tokens (the text modulation's reading) has no single word to weigh."""
    from vidgen.models.extensions import TextVelocity
    from vidgen.models.text_encoders import MiniLMTextEncoder
    from vidgen.shapes import captions, world
    from vidgen.training.transformer import caption_velocities

    encoder = MiniLMTextEncoder.load(max_length=32, device="cpu")
    config = TransformerTrainConfig(size=64)

    def batch(count, held_out, seed):
        rng = np.random.default_rng(seed)
        texts = [
            captions.caption(world.sample_scene(rng), rng, paraphrase=True, held_out=held_out)
            for _ in range(count)
        ]
        with torch.no_grad():
            return encoder(texts).float(), caption_velocities(texts, config, temporal=4, spatial=4)

    train_text, train_velocity = batch(1024, False, 0)
    test_text, test_velocity = batch(256, True, 1)
    torch.manual_seed(0)
    pooling = TextVelocity(train_text.shape[-1])
    optimizer = torch.optim.Adam(pooling.parameters(), lr=3e-3)
    for _ in range(300):
        pick = torch.randint(0, len(train_text), (128,))
        loss = (pooling(train_text[pick]) - train_velocity[pick]).square().sum(dim=1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        got = pooling(test_text)
    named = test_velocity.abs() > 1e-6
    assert named.sum() > 100
    right = (got[named].sign() == test_velocity[named].sign()).float().mean()
    assert right >= 0.9, right
    # no direction named: near zero next to the named speeds (a slow diagonal is 0.23 a latent frame)
    assert got[~named.any(dim=1)].abs().mean() < 0.15


def test_a_decoder_fine_tune_with_context_starts_as_its_source(autoencoder):
    """``decoder_context=1`` from ``init_from``: the source's weights, the new input weights zero,
    so it decodes exactly as the source until trained."""
    from vidgen.models.autoencoder import AutoencoderKLLite
    from vidgen.training.autoencoder import _load_decoder_fine_tune

    _, final = autoencoder
    source = AutoencoderKLLite.from_pretrained(final).eval()
    tuned = _load_decoder_fine_tune(AutoencoderTrainConfig(init_from=str(final), decoder_context=1)).eval()
    assert tuned.config.decoder_context == 1 and tuned.decoder[0].in_channels == 2 * source.config.z_dim
    z = torch.randn(2, source.config.z_dim, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(tuned.decode(z).sample, source.decode(z).sample, atol=1e-6, rtol=0)


def test_rollout_estimator_gives_the_transformers_estimates_of_whole_chunks(tmp_path):
    """The estimator normalises with the pipeline's latent statistics, replaces every whole chunk by
    ``rollout_estimates`` under the captions and noise it draws from ``rng`` (the same draws give
    the same result), leaves a remainder frame as it was, and returns unnormalised latents."""
    from tests.tiny import save_tiny_pipeline
    from vidgen.models.autoencoder import AutoencoderKLLite
    from vidgen.pipelines.vae_stream import latent_stats
    from vidgen.shapes import captions, world
    from vidgen.training.autoencoder import RolloutEstimator
    from vidgen.training.transformer import rollout_estimates, text_pair_batched

    folder = save_tiny_pipeline(tmp_path / "pipe")
    config = AutoencoderTrainConfig(estimate_sigma_min=0.4, estimate_sigma_max=0.6)
    estimator = RolloutEstimator(str(folder), config)
    c = estimator.chunk_frames
    z = torch.randn(2, 4, 2 * c + 1, 8, 8, generator=torch.Generator().manual_seed(1))
    scenes = [world.sample_scene(3), world.sample_scene(4)]
    out = estimator(z, scenes, np.random.default_rng(7))

    rng = np.random.default_rng(7)  # the estimator's draws, in its order
    texts = [captions.caption(scene, rng, paraphrase=True) for scene in scenes]
    generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
    mean, std = latent_stats(AutoencoderKLLite.from_pretrained(folder / "vae"))
    text = text_pair_batched(estimator.text_encoder, texts, texts)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=estimator.bf16):
        expected = rollout_estimates(
            estimator.transformer,
            ((z - mean) / std)[:, :, : 2 * c],
            text,
            c,
            (0.4, 0.6),
            (1, 2, 2),
            generator,
        )
    torch.testing.assert_close(out[:, :, : 2 * c], expected.float() * std + mean, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[:, :, 2 * c :], z[:, :, 2 * c :])
    assert (out[:, :, : 2 * c] - z[:, :, : 2 * c]).abs().max() > 1e-2
    torch.testing.assert_close(estimator(z, scenes, np.random.default_rng(7)), out)


def test_a_decoder_fine_tune_decodes_the_estimates_of_the_last_clips_of_a_batch(
    autoencoder, tmp_path, monkeypatch
):
    """``estimates_from``: the last ``estimate_share`` of each batch's clips are decoded from the
    estimator's output, the others from their own (perturbed) latents; the encoder stays frozen and
    the context weights leave zero. Without ``freeze_encoder``, or with ``still_group_share +
    estimate_share`` above 1, the run refuses to start."""
    from tests.tiny import save_tiny_pipeline
    from vidgen.models.autoencoder import AutoencoderKLLite
    from vidgen.training import autoencoder as ae

    _, final = autoencoder
    folder = save_tiny_pipeline(tmp_path / "pipe")
    made, decoded = [], []
    estimate = ae.RolloutEstimator.__call__

    def recording_estimate(self, z, scenes, rng):
        made.append(estimate(self, z, scenes, rng))
        return made[-1]

    decode = AutoencoderKLLite.decode_unclamped

    def recording_decode(self, z, *args, **kwargs):
        if self.training:
            decoded.append(z.detach().clone())
        return decode(self, z, *args, **kwargs)

    monkeypatch.setattr(ae.RolloutEstimator, "__call__", recording_estimate)
    monkeypatch.setattr(AutoencoderKLLite, "decode_unclamped", recording_decode)
    settings = dict(TINY_AE, num_frames=9, batch_size=4, eval_clips=1)
    config = AutoencoderTrainConfig(
        run_dir=str(tmp_path / "run"),
        init_from=str(final),
        freeze_encoder=True,
        decoder_context=1,
        estimates_from=str(folder),
        estimate_share=0.5,
        steps=3,
        warmup=1,
        lr=1e-3,
        **{k: v for k, v in settings.items() if k not in ("z_dim", "hidden_channels")},
    )
    ae.train_autoencoder(config)
    assert len(made) == len(decoded) == 3
    for estimates, z in zip(made, decoded):
        assert torch.equal(z[2:], estimates)
        assert (z[:2, :, :2] - estimates[:, :, :2]).abs().max() > 1e-2
    source = AutoencoderKLLite.from_pretrained(final)
    from safetensors.torch import load_file

    trained = load_file(str(tmp_path / "run" / "latest" / "model.safetensors"))
    for name, value in source.encoder.state_dict().items():
        assert torch.equal(trained[f"encoder.{name}"], value)
    assert trained["decoder.0.weight"][:, 4:].abs().max() > 0
    with pytest.raises(ValueError, match="freeze_encoder"):
        ae.train_autoencoder(dataclasses.replace(config, run_dir=str(tmp_path / "r2"), freeze_encoder=False))
    # still groups take the first clips, estimates the last: shares above 1 in all would overlap
    with pytest.raises(ValueError, match="at most 1"):
        ae.train_autoencoder(
            dataclasses.replace(config, run_dir=str(tmp_path / "r3"), still_group_share=0.75)
        )
    assert not (tmp_path / "r3").exists()


def test_still_groups_decode_the_latents_of_the_clip_held_still_in_each_group(
    autoencoder, tmp_path, monkeypatch
):
    """``still_group_share``: the first clips of a batch decode the latents of their video with each
    4-frame group held at its last frame (frame 0 kept), against the moving clip as the target."""
    from vidgen.models.autoencoder import AutoencoderKLLite
    from vidgen.training import autoencoder as ae

    assert ae.still_group_frames(10) == [0, 4, 4, 4, 4, 8, 8, 8, 8, 12][:10]
    assert ae.still_group_frames(9) == [0, 4, 4, 4, 4, 8, 8, 8, 8]
    _, final = autoencoder
    seen = []
    loss = ae.reconstruction_loss

    def recording_loss(model, batch, config, *args):
        seen.append((batch.video.clone(), model))
        return loss(model, batch, config, *args)

    decoded = []
    decode = AutoencoderKLLite.decode_unclamped

    def recording_decode(self, z, *args, **kwargs):
        if self.training:
            decoded.append(z.detach().clone())
        return decode(self, z, *args, **kwargs)

    monkeypatch.setattr(ae, "reconstruction_loss", recording_loss)
    monkeypatch.setattr(AutoencoderKLLite, "decode_unclamped", recording_decode)
    settings = {k: v for k, v in TINY_AE.items() if k not in ("z_dim", "hidden_channels")}
    config = AutoencoderTrainConfig(
        run_dir=str(tmp_path / "run"),
        init_from=str(final),
        freeze_encoder=True,
        decoder_context=1,
        still_group_share=0.5,
        latent_noise=0.0,
        steps=1,
        warmup=1,
        **{**settings, "num_frames": 9, "batch_size": 4, "eval_clips": 1},
    )
    ae.train_autoencoder(config)
    (video, model), z = seen[0], decoded[0]
    with torch.no_grad():
        held = model.encode(video[:2, :, [0, 4, 4, 4, 4, 8, 8, 8, 8]]).latent_dist.mode()
        own = model.encode(video[2:]).latent_dist.mode()
    torch.testing.assert_close(z[:2], held, atol=1e-5, rtol=0)
    torch.testing.assert_close(z[2:], own, atol=1e-5, rtol=0)
    assert (held - model.encode(video[:2]).latent_dist.mode()).abs().max() > 1e-3
    # finalized, the fine-tune keeps the source's latent statistics exactly (not re-measured)
    tuned = json.loads(
        (
            finalize_autoencoder(tmp_path / "run", tmp_path / "out", clips=2, size=32) / "config.json"
        ).read_text()
    )
    source = json.loads((final / "config.json").read_text())
    assert tuned["latents_mean"] == source["latents_mean"] and tuned["latents_std"] == source["latents_std"]
    assert tuned["decoder_context"] == 1
