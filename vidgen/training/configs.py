"""Training configurations (plain dataclasses, importable without torch, one flag per field in
``vidgen train``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AutoencoderTrainConfig:
    run_dir: str = "runs/autoencoder"
    """Folder for checkpoints (``latest/``) and ``log.jsonl``."""
    size: int = 64
    """Canvas side in pixels."""
    num_frames: int = 9
    """Frames per training clip (1 + 4k)."""
    batch_size: int = 12
    steps: int = 20000
    """Total optimiser steps of the run (a resumed run continues towards it)."""
    minutes: float = 0.0
    """Stop this stretch after this many minutes (0: run to ``steps``)."""
    stretch_steps: int = 0
    """Stop this stretch after this many steps (0: run to ``steps``)."""
    lr: float = 1e-3
    warmup: int = 200
    weight_decay: float = 0.0
    object_weight: float = 20.0
    """Extra loss weight on object pixels and their 1-pixel neighbourhood."""
    temporal_weight: float = 4.0
    """Weight of the frame-difference loss (keeps sub-pixel motion inside a group)."""
    kl_weight: float = 1e-6
    latent_noise: float = 0.1
    """Std (relative to the latent's std) of the perturbation decoded on half the batch."""
    ema_decay: float = 0.999
    init_from: str = ""
    """Start from a finalized autoencoder folder (e.g. to fine-tune its decoder)."""
    freeze_encoder: bool = False
    """Train the decoder only: latents (and a transformer trained on them) stay valid."""
    z_dim: int = 8
    hidden_channels: int = 96
    upsample_channels: int = 0
    """Decoder head: 0 a pixel shuffle at latent resolution; N two 2x stages with N channels."""
    seed: int = 0
    log_every: int = 50
    save_every: int = 500
    eval_clips: int = 48
    threads: int = 0
    """torch threads (0: leave torch's default)."""


@dataclass
class TransformerTrainConfig:
    run_dir: str = "runs/transformer"
    """Folder for checkpoints (``latest/``) and ``log.jsonl``."""
    autoencoder: str = "runs/autoencoder/final"
    """Folder of the trained autoencoder (config.json + weights, with latents_mean/std)."""
    size: int = 64
    chunk_frames: int = 2
    """Latent frames per chunk."""
    sink_frames: int = 2
    window_frames: int = 4
    max_gap: int = 40
    """Largest gap, in latent frames, between the sinks and the window."""
    batch_size: int = 8
    steps: int = 40000
    minutes: float = 0.0
    """Stop this stretch after this many minutes (0: run to ``steps``)."""
    stretch_steps: int = 0
    """Stop this stretch after this many steps (0: run to ``steps``)."""
    lr: float = 4e-4
    warmup: int = 500
    weight_decay: float = 0.01
    ema_decay: float = 0.9995
    sigma_shift: float = 3.0
    """Shift of the training noise levels (more time at high noise)."""
    clean_context_prob: float = 0.5
    context_sigma_max: float = 0.1
    object_weight: float = 8.0
    """Extra loss weight on the latent cells of the object and their neighbours."""
    caption_dropout: float = 0.1
    transition_prob: float = 0.2
    """Samples whose last chunks follow a fresh prompt change (text = new ‖ old)."""
    late_appearance_prob: float = 0.08
    """Samples where an appearance change has not shown yet (text = new ‖ new)."""
    gap_change_prob: float = 0.12
    """Samples whose prompt changed in the gap (sinks show the old prompt)."""
    text_max_length: int = 32
    compile: bool = True
    """torch.compile the training forward (one compile of a few minutes, then ~1.7x faster steps)."""
    bf16: bool = True
    """bfloat16 autocast for the transformer's matmuls (2-3x faster on CPUs with AVX-512 BF16)."""
    model: dict = field(
        default_factory=lambda: dict(
            patch_size=(1, 2, 2),
            num_attention_heads=3,
            attention_head_dim=64,
            in_channels=8,
            out_channels=8,
            text_dim=384,
            freq_dim=128,
            ffn_dim=576,
            num_layers=8,
            rope_max_seq_len=256,
        )
    )
    seed: int = 0
    log_every: int = 50
    save_every: int = 1000
    threads: int = 0
