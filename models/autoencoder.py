"""A light video autoencoder with the interface of diffusers' ``AutoencoderKLWan``.

Same contract as Wan's VAE, so the pipeline treats both alike: video (B, 3, T, H, W) in [-1, 1]
with ``T = 1 + 4k``; latents (B, z_dim, 1 + k, H / 4, W / 4); the first latent frame holds the
first video frame alone and every later latent frame the next four frames; ``encode`` returns a
``latent_dist``, ``decode`` a ``sample`` clamped to [-1, 1]; ``latents_mean``/``latents_std`` in
the config normalise latents for the transformer.

Design: each group of four frames is stacked on the channel axis and folded into 4x4 patches
(pixel unshuffle), so every convolution runs at latent resolution; a small full-resolution head
sharpens edges that cross patch borders. Groups are encoded independently. With
``decoder_context=0`` they are decoded independently too, so decoding a video chunk by chunk equals
decoding it whole with no state between chunks. With ``decoder_context=1`` the decoder also reads
the latent frame before each one (latent frame 0 reads itself): a denoiser's latents place the
object in each group but hardly say how it moves inside the group, and the frame before says where
it came from. Chunk-by-chunk decoding then carries one latent frame (``previous``). It is the
autoencoder of the embedded default model (see ``vidgen/default_model/MODEL_CARD.md`` for why it
was chosen over a tiny ``AutoencoderKLWan``).
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.autoencoders.vae import DecoderOutput, DiagonalGaussianDistribution
from diffusers.models.modeling_outputs import AutoencoderKLOutput
from diffusers.models.modeling_utils import ModelMixin
from torch import nn


class Conv2d(nn.Conv2d):
    """``nn.Conv2d`` whose inference on a CPU gives the same bits for 1, 2, 4, 8 or 16 threads.

    oneDNN, PyTorch's default CPU convolution, splits the sums of a 1x1 convolution by thread: the
    same video decoded with 1 and 2 threads differed by ~1e-6, and after rounding to uint8 in 48
    pixels of frame 52 (measured); its 3x3 convolutions here do not. Without a gradient, on a CPU,
    a 1x1 convolution runs PyTorch's own kernel (one matrix product per image), as fast here and
    whose sums do not follow those thread counts (3 or 6 threads still round otherwise: the
    automatic count is a power of two, ``pipelines.loading.auto_threads``). The weights, training
    (gradients), bfloat16 autocast and other devices are ``nn.Conv2d``'s. The embedded model's
    real-time factor on one thread: 1.26-1.46 against oneDNN's 1.38-1.42 (30-s videos, measured)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            x.device.type != "cpu"
            or torch.is_grad_enabled()
            or torch.is_autocast_enabled("cpu")  # bfloat16 encodes (training) keep oneDNN's speed
            or torch.compiler.is_compiling()
            or self.groups != 1
            or self.padding_mode != "zeros"
            or self.dilation != (1, 1)
            or isinstance(self.padding, str)
            or self.kernel_size != (1, 1)
        ):
            return super().forward(x)
        return torch.ops.aten.thnn_conv2d(
            x, self.weight, self.kernel_size, self.bias, self.stride, self.padding
        )


class ResBlock(nn.Module):
    def __init__(self, channels: int, groups: int = 8) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels)
        self.conv1 = Conv2d(channels, channels, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, channels)
        self.conv2 = Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        return x + self.conv2(F.silu(self.norm2(h)))


class AutoencoderKLLite(ModelMixin, ConfigMixin):  # type: ignore[misc]  # diffusers' two config_name
    """4x temporal, 4x spatial video autoencoder (see the module docstring)."""

    _supports_gradient_checkpointing = False
    config: Any  # diffusers' FrozenDict of the __init__ arguments, read as attributes (typed there as a dict)

    @register_to_config
    def __init__(
        self,
        in_channels: int = 3,
        z_dim: int = 8,
        hidden_channels: int = 96,
        encoder_blocks: int = 3,
        decoder_blocks: int = 4,
        refine_channels: int = 32,
        upsample_channels: int = 0,
        scale_factor_temporal: int = 4,
        scale_factor_spatial: int = 4,
        latents_mean: list[float] | None = None,
        latents_std: list[float] | None = None,
        decoder_context: int = 0,
    ) -> None:
        super().__init__()
        if decoder_context not in (0, 1):
            raise ValueError(
                f"decoder_context is 0 or 1 (latent frames before each one), got {decoder_context}"
            )
        t, s = scale_factor_temporal, scale_factor_spatial
        folded = in_channels * t * s * s
        self.encoder = nn.Sequential(
            Conv2d(folded, hidden_channels, 1),
            *[ResBlock(hidden_channels) for _ in range(encoder_blocks)],
            nn.GroupNorm(8, hidden_channels),
            nn.SiLU(),
            Conv2d(hidden_channels, 2 * z_dim, 1),
        )
        # with upsample_channels, the last step is two 2x stages, the second one convolving each
        # frame at half resolution: edges land on exact sub-cell positions in every frame of a group
        head_channels = t * upsample_channels * 4 if upsample_channels else folded
        self.decoder = nn.Sequential(
            Conv2d(z_dim * (1 + decoder_context), hidden_channels, 1),
            *[ResBlock(hidden_channels) for _ in range(decoder_blocks)],
            nn.GroupNorm(8, hidden_channels),
            nn.SiLU(),
            Conv2d(hidden_channels, head_channels, 1),
        )
        self.upsampler = None
        if upsample_channels:
            if s != 4:
                raise ValueError("upsample_channels needs scale_factor_spatial=4")
            self.upsampler = nn.Sequential(
                Conv2d(upsample_channels, upsample_channels, 3, padding=1),
                nn.SiLU(),
                Conv2d(upsample_channels, upsample_channels, 3, padding=1),
                nn.SiLU(),
                Conv2d(upsample_channels, in_channels * 4, 1),
            )
        frames_channels = in_channels * t
        self.refine = nn.Sequential(
            Conv2d(frames_channels, refine_channels, 3, padding=1),
            nn.SiLU(),
            Conv2d(refine_channels, frames_channels, 3, padding=1),
        )
        refine_out, moments_out = cast(nn.Conv2d, self.refine[-1]), cast(nn.Conv2d, self.encoder[-1])
        assert refine_out.bias is not None and moments_out.bias is not None  # both made with a bias
        nn.init.zeros_(refine_out.weight)
        nn.init.zeros_(refine_out.bias)
        # start with a small posterior variance: a latent that is mostly noise at first trains badly
        with torch.no_grad():
            moments_out.bias[z_dim:].fill_(-6.0)

    # ------------------------------------------------------------------ geometry
    @property
    def temporal_compression_ratio(self) -> int:
        return self.config.scale_factor_temporal

    @property
    def spatial_compression_ratio(self) -> int:
        return self.config.scale_factor_spatial

    def _groups(self, video: torch.Tensor) -> torch.Tensor:
        """(B, C, 1 + 4k, H, W) -> (B * (1 + k), C * 4, H, W); the first frame fills its own group."""
        b, c, frames, h, w = video.shape
        t = self.config.scale_factor_temporal
        if (frames - 1) % t:
            raise ValueError(f"the autoencoder takes 1 + {t}k frames, got {frames}")
        first = video[:, :, :1].expand(b, c, t, h, w)
        video = torch.cat([first, video[:, :, 1:]], dim=2)  # (B, C, (1 + k) * t, H, W)
        groups = video.unflatten(2, (-1, t)).permute(0, 2, 3, 1, 4, 5)  # (B, 1 + k, t, C, H, W)
        return groups.flatten(2, 3).flatten(0, 1)

    # ------------------------------------------------------------------ encode
    def encode_moments(self, video: torch.Tensor) -> torch.Tensor:
        """Mean and log-variance, (B, 2 * z_dim, 1 + k, H / 4, W / 4)."""
        b, _, frames, h, w = video.shape
        s = self.config.scale_factor_spatial
        if h % s or w % s:
            raise ValueError(f"frame size {h}x{w} is not divisible by {s}")
        x = F.pixel_unshuffle(self._groups(video), s)
        moments = self.encoder(x)  # (B * groups, 2z, h, w)
        return moments.unflatten(0, (b, -1)).transpose(1, 2)

    def encode(self, x: torch.Tensor, return_dict: bool = True) -> AutoencoderKLOutput | tuple:
        posterior = DiagonalGaussianDistribution(self.encode_moments(x))
        return AutoencoderKLOutput(latent_dist=posterior) if return_dict else (posterior,)

    # ------------------------------------------------------------------ decode
    def _with_context(
        self, z: torch.Tensor, first_latent_index: int, previous: torch.Tensor | None
    ) -> torch.Tensor:
        """``z`` (B, z_dim, n, h, w) with the latent frame before each one stacked on the channels."""
        if not self.config.decoder_context:
            return z
        if previous is None:
            if first_latent_index:
                raise ValueError(
                    "this decoder reads the latent frame before each one: pass previous= (latent frame "
                    f"{first_latent_index - 1}) to decode from latent frame {first_latent_index}"
                )
            previous = z[:, :, :1]  # latent frame 0 (the first video frame) reads itself
        before = torch.cat([previous.to(z.dtype), z[:, :, :-1]], dim=2)
        return torch.cat([z, before], dim=1)

    def decode_unclamped(
        self, z: torch.Tensor, first_latent_index: int = 0, previous: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Decode latents (B, z_dim, n, h, w) whose first frame is latent frame ``first_latent_index``
        of the video; the output is not clamped (training needs gradients beyond [-1, 1]).
        ``previous`` (B, z_dim, 1, h, w): the latent frame before ``z``'s first, which a decoder with
        ``decoder_context`` needs from latent frame 1 on."""
        b, _, n, h, w = z.shape
        t, s = self.config.scale_factor_temporal, self.config.scale_factor_spatial
        z = self._with_context(z, first_latent_index, previous)
        x = self.decoder(z.transpose(1, 2).flatten(0, 1))  # (B * n, C * t * s * s, h, w)
        if self.upsampler is None:
            x = F.pixel_shuffle(x, s)  # (B * n, C * t, H, W)
        else:
            x = F.pixel_shuffle(x, 2)  # (B * n, t * U, 2h, 2w)
            x = self.upsampler(x.unflatten(1, (t, -1)).flatten(0, 1))  # (B * n * t, C * 4, 2h, 2w)
            x = F.pixel_shuffle(x, 2).unflatten(0, (b * n, t)).flatten(1, 2)  # (B * n, t * C, H, W)
        x = x + self.refine(x)
        video = x.unflatten(1, (t, -1)).unflatten(0, (b, n))  # (B, n, t, C, H, W)
        video = video.permute(0, 3, 1, 2, 4, 5).flatten(2, 3)  # (B, C, n * t, H, W)
        if first_latent_index == 0:
            video = video[:, :, t - 1 :]  # the first latent frame decodes to one video frame
        return video

    def decode(
        self,
        z: torch.Tensor,
        return_dict: bool = True,
        first_latent_index: int = 0,
        previous: torch.Tensor | None = None,
    ) -> DecoderOutput | tuple:
        video = self.decode_unclamped(z, first_latent_index, previous).clamp(-1.0, 1.0)
        return DecoderOutput(sample=video) if return_dict else (video,)

    def forward(self, video: torch.Tensor, sample_posterior: bool = True) -> torch.Tensor:
        posterior = cast(AutoencoderKLOutput, self.encode(video)).latent_dist
        z = posterior.sample() if sample_posterior else posterior.mode()
        return cast(DecoderOutput, self.decode(z)).sample
