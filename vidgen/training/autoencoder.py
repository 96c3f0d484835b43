"""Training the default model's autoencoder (:class:`AutoencoderKLLite`) on Shapes World.

Loss: L1 + L2 on pixels, weighted up on and around the object (its pixels are ~2% of a frame but
all of what the evaluator judges), a small KL term, and decoding of slightly perturbed latents so
that the decoder forgives the denoiser's small errors. Decoding is not clamped while training
(a clamp has no gradient outside [-1, 1]).

A denoiser's latents place the object in each 4-frame group but carry little of how it moves
inside the group (the sampler settles that between sigma 0.9 and 0.75, from its own still
guesses), so generated objects jump at each group and stand still in between. With
``decoder_context`` the decoder reads the latent frame before each one, which says where the
object came from. It learns to move the object from there from two kinds of input, decoded
against the moving clip: the clip's latents with each group held still (``still_group_share``,
what made the difference; see docs/default-model-training-log.md, stop 30), and a transformer's rollout estimates of the
clip's latents (``estimates_from``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vidgen.config import cpu_has_native_bf16
from vidgen.models.autoencoder import AutoencoderKLLite
from vidgen.training.configs import AutoencoderTrainConfig
from vidgen.training.data import sample_video_batch
from vidgen.training.loop import TrainingRun


def reconstruction_loss(
    model: AutoencoderKLLite,
    batch,
    config: AutoencoderTrainConfig,
    estimator: RolloutEstimator | None = None,
    rng: np.random.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one batch; with ``estimator``, the last ``estimate_share`` of its clips decode
    the transformer's estimates (captions and noise drawn from ``rng``)."""
    video, masks = batch.video, batch.masks
    if config.freeze_encoder:
        with torch.no_grad():
            posterior = model.encode(video).latent_dist
    else:
        posterior = model.encode(video).latent_dist
    z = posterior.mode() if config.freeze_encoder else posterior.sample()
    still = round(config.still_group_share * z.shape[0])
    if still:  # the first clips decode the latents of their groups held still at their last frames
        with torch.no_grad():
            held = model.encode(video[:still, :, still_group_frames(video.shape[2])]).latent_dist.mode()
        z = torch.cat([held.to(z.dtype), z[still:]])
    if config.latent_noise > 0:
        half = z.shape[0] // 2
        scale = z[:half].detach().std() * config.latent_noise
        z = torch.cat([z[:half] + scale * torch.randn_like(z[:half]), z[half:]])
    if estimator is not None:  # the last clips of the batch decode the transformer's estimates
        rng = rng if rng is not None else np.random.default_rng()
        count = round(config.estimate_share * z.shape[0])
        if count:
            scenes = [clip.scenes[int(clip.scene_index[0])] for clip in batch.clips[-count:]]
            z = torch.cat([z[:-count], estimator(posterior.mode()[-count:], scenes, rng)])
    recon = model.decode_unclamped(z)
    # (B, T, S, S) -> object pixels and a one-pixel ring around them
    near = F.max_pool2d(masks.flatten(0, 1)[:, None], 3, stride=1, padding=1).view_as(masks)
    weight = (1.0 + config.object_weight * near)[:, None]  # (B, 1, T, S, S)
    err = recon - video
    l1 = (weight * err.abs()).mean()
    l2 = (weight * err.square()).mean()
    # motion inside a 4-frame group moves edges by sub-pixel amounts that barely register in the
    # pixel loss; matching frame-to-frame differences makes the decoder reproduce them
    moved = torch.maximum(weight[:, :, 1:], weight[:, :, :-1])
    temporal = (moved * (recon.diff(dim=2) - video.diff(dim=2)).abs()).mean()
    kl = posterior.kl().mean() / z[0].numel()
    loss = l1 + l2 + config.temporal_weight * temporal + config.kl_weight * kl
    return loss, {"l1": l1.item(), "l2": l2.item(), "temporal": temporal.item(), "kl": kl.item()}


@torch.no_grad()
def evaluate_reconstructions(
    model: AutoencoderKLLite, config: AutoencoderTrainConfig, clips: int
) -> dict[str, float]:
    """PSNR and the Shapes World evaluator's verdicts on reconstructions of held-out clips (fixed
    seed, no prompt changes): the ceiling any denoiser working in this latent space can reach."""
    from vidgen.shapes.evaluate import FRAME_REASONS, evaluate_video

    rng = np.random.default_rng(10_000 + config.seed)
    batch = sample_video_batch(rng, clips, 33, config.size, storyboard_prob=0.0)
    model.eval()
    recon = torch.cat([model.decode(model.encode(v[None]).latent_dist.mode()).sample for v in batch.video])
    mse = (recon - batch.video).square().mean(dim=(1, 2, 3, 4))
    psnr = float((10 * torch.log10(4.0 / mse)).mean())
    videos = ((recon + 1) * 127.5).round().clamp(0, 255).byte().permute(0, 2, 3, 4, 1).numpy()
    frame_pass, adheres, failures = [], [], dict.fromkeys(FRAME_REASONS, 0)
    for clip, video in zip(batch.clips, videos):
        report = evaluate_video(video, clip.scenes[int(clip.scene_index[0])])
        frame_pass.append(report.frame_pass_rate)
        adheres.append(report.adheres)
        for reason in FRAME_REASONS:
            failures[reason] += report.failures.get(reason, 0)
    total_frames = sum(len(c) for c in batch.clips)
    metrics = {"psnr": psnr, "frame_pass": float(np.mean(frame_pass)), "adheres": float(np.mean(adheres))}
    metrics.update({f"fail_{k}": v / total_frames for k, v in failures.items() if v})
    return metrics


def still_group_frames(num_frames: int, t: int = 4) -> list[int]:
    """Frame indices that hold each group of ``t`` frames still at its last frame (frame 0, its own
    group, stays): a video whose latents place the object in each group but do not move it there,
    as a denoiser's latents mostly do."""
    return [0] + [t * ((f - 1) // t) + t for f in range(1, num_frames)]


class RolloutEstimator:
    """A pipeline's transformer's one-step rollout estimates of clips' latents
    (``vidgen.training.transformer.rollout_estimates``), captioned with paraphrases of their
    scenes; takes and returns unnormalised latents (B, z_dim, F, h, w)."""

    def __init__(self, folder: str, config: AutoencoderTrainConfig) -> None:
        from vidgen import LongVideoPipeline
        from vidgen.pipelines.vae_stream import latent_stats

        pipe = LongVideoPipeline.from_pretrained(folder)
        self.transformer = pipe.transformer.eval().requires_grad_(False)
        self.text_encoder = pipe.text_encoder
        self.chunk_frames = pipe.config.generation.chunk_frames
        self.mean, self.std = latent_stats(pipe.vae)
        self.sigma_range = (config.estimate_sigma_min, config.estimate_sigma_max)
        self.bf16 = cpu_has_native_bf16()

    @torch.no_grad()
    def __call__(self, z: torch.Tensor, scenes: list, rng: np.random.Generator) -> torch.Tensor:
        from vidgen.shapes import captions
        from vidgen.training.transformer import rollout_estimates, text_pair_batched

        frames = z.shape[2] - z.shape[2] % self.chunk_frames  # whole chunks; a remainder stays as encoded
        texts = [captions.caption(scene, rng, paraphrase=True) for scene in scenes]
        generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
        text = text_pair_batched(self.text_encoder, texts, texts)
        normalised = (z.float() - self.mean) / self.std
        # as the transformer trained: bf16 matmuls where the CPU has them natively
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            estimates = rollout_estimates(
                self.transformer,
                normalised[:, :, :frames].to(self.transformer.dtype),
                text.to(self.transformer.dtype),
                self.chunk_frames,
                self.sigma_range,
                tuple(self.transformer.config.patch_size),
                generator,
            )
        out = z.clone()
        out[:, :, :frames] = (estimates.float() * self.std + self.mean).to(z.dtype)
        return out


def _load_decoder_fine_tune(config: AutoencoderTrainConfig) -> AutoencoderKLLite:
    """``init_from``'s weights in a model of this config's decoder shape: a wider first decoder
    layer (``decoder_context``) keeps the source's weights for the latent frame itself and starts
    at zero for the one before, so the model first decodes exactly as the source."""
    source = AutoencoderKLLite.from_pretrained(config.init_from)
    settings = {k: v for k, v in source.config.items() if not k.startswith("_")}
    # upsample_channels 0 (the default) keeps the source's decoder head
    upsample = config.upsample_channels or settings.get("upsample_channels", 0)
    model = AutoencoderKLLite(
        **{**settings, "upsample_channels": upsample, "decoder_context": config.decoder_context}
    )
    target = model.state_dict()
    matching = {k: v for k, v in source.state_dict().items() if k in target and target[k].shape == v.shape}
    first = "decoder.0.weight"
    source_first = source.state_dict()[first]
    if target[first].shape != source_first.shape:
        widened = torch.zeros_like(target[first])
        widened[:, : source_first.shape[1]] = source_first
        matching[first] = widened
    model.load_state_dict(matching, strict=False)
    return model


def train_autoencoder(config: AutoencoderTrainConfig) -> Path:
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    if config.estimates_from and not (config.freeze_encoder and config.init_from):
        raise ValueError(
            "estimates_from needs init_from and freeze_encoder: the transformer's estimates live "
            "in the latent space of the autoencoder it was trained on"
        )
    if config.estimates_from and config.still_group_share + config.estimate_share > 1:
        # the estimates replace the last clips of the batch, the still groups the first: above 1
        # they overlap and the estimates silently take some of the still clips
        raise ValueError(
            f"still_group_share + estimate_share must be at most 1, got "
            f"{config.still_group_share} + {config.estimate_share}"
        )
    if config.init_from:
        # decoder fine-tuning: the encoder (and so the latent space a transformer learned) stays
        # fixed; a decoder of another shape (upsample_channels, decoder_context) starts from the
        # matching weights
        model = _load_decoder_fine_tune(config)
    else:
        model = AutoencoderKLLite(
            z_dim=config.z_dim,
            hidden_channels=config.hidden_channels,
            upsample_channels=config.upsample_channels,
            decoder_context=config.decoder_context,
        )
    estimator = RolloutEstimator(config.estimates_from, config) if config.estimates_from else None
    if config.freeze_encoder:
        model.encoder.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    run = TrainingRun(
        config,
        model,
        optimizer,
        lr_floor=0.05,
        evaluate=lambda ema_model: evaluate_reconstructions(ema_model, config, config.eval_clips),
    )
    while not run.done:
        rng = np.random.default_rng([config.seed, run.step])  # data is a function of the step: resumable
        # estimates are captioned with the clip's first scene: no prompt changes inside their clips
        storyboards = {"storyboard_prob": 0.0} if estimator is not None else {}
        batch = sample_video_batch(rng, config.batch_size, config.num_frames, config.size, **storyboards)
        model.train()
        loss, parts = reconstruction_loss(model, batch, config, estimator, rng)
        if not run.update(loss, **parts):
            break
    return run.finish()


@torch.no_grad()
def finalize_autoencoder(
    run_dir: str | Path, out_dir: str | Path, clips: int = 64, size: int = 64, seed: int = 123
) -> Path:
    """Save the EMA weights of a run with per-channel ``latents_mean``/``latents_std`` measured on
    held-out clips, ready for transformer training and shipping. A decoder fine-tune over a frozen
    encoder keeps its source's statistics exactly: a transformer trained on that latent space
    normalises with them."""
    latest = Path(run_dir) / "latest"
    config = AutoencoderKLLite.load_config(latest)
    model = AutoencoderKLLite.from_config(config)
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(latest / "ema.safetensors")))
    model.eval()
    state = latest / "state.json"
    run = json.loads(state.read_text()).get("config", {}) if state.exists() else {}
    if run.get("freeze_encoder") and run.get("init_from") and config.get("latents_mean") is not None:
        model.save_pretrained(out_dir)
        return Path(out_dir)
    batch = sample_video_batch(np.random.default_rng(seed), clips, 17, size)
    z = torch.cat([model.encode(v[None]).latent_dist.mode() for v in batch.video])  # (N, z, T, h, w)
    dims = (0, 2, 3, 4)
    model.register_to_config(
        latents_mean=[round(float(x), 5) for x in z.mean(dim=dims)],
        latents_std=[round(float(x), 5) for x in z.std(dim=dims)],
    )
    model.save_pretrained(out_dir)
    return Path(out_dir)
