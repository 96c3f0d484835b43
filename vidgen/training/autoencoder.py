"""Training the default model's autoencoder (:class:`AutoencoderKLLite`) on Shapes World.

Loss: L1 + L2 on pixels, weighted up on and around the object (its pixels are ~2% of a frame but
all of what the evaluator judges), a small KL term, and decoding of slightly perturbed latents so
that the decoder forgives the denoiser's small errors. Decoding is not clamped while training
(a clamp has no gradient outside [-1, 1]).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from vidgen.models.autoencoder import AutoencoderKLLite
from vidgen.training.configs import AutoencoderTrainConfig
from vidgen.training.data import sample_video_batch
from vidgen.training.loop import TrainingRun


def reconstruction_loss(
    model: AutoencoderKLLite, batch, config: AutoencoderTrainConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    video, masks = batch.video, batch.masks
    if config.freeze_encoder:
        with torch.no_grad():
            posterior = model.encode(video).latent_dist
    else:
        posterior = model.encode(video).latent_dist
    z = posterior.mode() if config.freeze_encoder else posterior.sample()
    if config.latent_noise > 0:
        half = z.shape[0] // 2
        scale = z[:half].detach().std() * config.latent_noise
        z = torch.cat([z[:half] + scale * torch.randn_like(z[:half]), z[half:]])
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


def train_autoencoder(config: AutoencoderTrainConfig) -> Path:
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    if config.init_from:
        # decoder fine-tuning: the encoder (and so the latent space a transformer learned) stays
        # fixed; a decoder of another shape (upsample_channels) starts from the matching weights
        source = AutoencoderKLLite.from_pretrained(config.init_from)
        settings = {k: v for k, v in source.config.items() if not k.startswith("_")}
        model = AutoencoderKLLite(**{**settings, "upsample_channels": config.upsample_channels})
        target = model.state_dict()
        matching = {
            k: v for k, v in source.state_dict().items() if k in target and target[k].shape == v.shape
        }
        model.load_state_dict(matching, strict=False)
    else:
        model = AutoencoderKLLite(
            z_dim=config.z_dim,
            hidden_channels=config.hidden_channels,
            upsample_channels=config.upsample_channels,
        )
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
        batch = sample_video_batch(rng, config.batch_size, config.num_frames, config.size)
        model.train()
        loss, parts = reconstruction_loss(model, batch, config)
        if not run.update(loss, **parts):
            break
    return run.finish()


@torch.no_grad()
def finalize_autoencoder(
    run_dir: str | Path, out_dir: str | Path, clips: int = 64, size: int = 64, seed: int = 123
) -> Path:
    """Save the EMA weights of a run with per-channel ``latents_mean``/``latents_std`` measured on
    held-out clips, ready for transformer training and shipping."""
    latest = Path(run_dir) / "latest"
    config = AutoencoderKLLite.load_config(latest)
    model = AutoencoderKLLite.from_config(config)
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(latest / "ema.safetensors")))
    model.eval()
    batch = sample_video_batch(np.random.default_rng(seed), clips, 17, size)
    z = torch.cat([model.encode(v[None]).latent_dist.mode() for v in batch.video])  # (N, z, T, h, w)
    dims = (0, 2, 3, 4)
    model.register_to_config(
        latents_mean=[round(float(x), 5) for x in z.mean(dim=dims)],
        latents_std=[round(float(x), 5) for x in z.std(dim=dims)],
    )
    model.save_pretrained(out_dir)
    return Path(out_dir)
