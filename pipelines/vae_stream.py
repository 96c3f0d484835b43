"""Chunk-by-chunk decoding (and prefill encoding) for the autoencoders the pipeline supports.

Both autoencoders follow Wan's causal layout: latent frame 0 holds video frame 0, every later latent
frame the next ``t`` frames. A :class:`StreamingDecoder` decodes a chunk of latents as soon as it is
made, keeping whatever state the autoencoder needs between chunks, so that decoding a video chunk by
chunk gives exactly the frames of decoding it whole:

* ``AutoencoderKLLite`` codes each latent frame independently -- no state at all -- or, with
  ``decoder_context=1``, reads the latent frame before each one: the last latent frame decoded is
  carried to the next chunk;
* diffusers' ``AutoencoderKLWan`` decodes with causal 3-D convolutions; its per-convolution cache
  (``_feat_map``) is carried from one chunk to the next, exactly as its own ``decode`` carries it
  from one latent frame to the next.

Latents inside the pipeline are normalised per channel (``(z - latents_mean) / latents_std``).
"""

from __future__ import annotations

import torch


def latent_stats(vae, device=None, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std (1, C, 1, 1, 1) of the autoencoder's latents (identity when absent)."""
    z_dim = vae.config.z_dim
    mean = vae.config.latents_mean or [0.0] * z_dim
    std = vae.config.latents_std or [1.0] * z_dim
    shape = (1, z_dim, 1, 1, 1)
    return (
        torch.tensor(mean, dtype=dtype, device=device).view(shape),
        torch.tensor(std, dtype=dtype, device=device).view(shape),
    )


def temporal_factor(vae) -> int:
    return int(getattr(vae.config, "scale_factor_temporal", None) or 4)


def spatial_factor(vae) -> int:
    return int(getattr(vae.config, "scale_factor_spatial", None) or 8)


def video_to_uint8(video: torch.Tensor) -> torch.Tensor:
    """(1, 3, T, H, W) decoded video in [-1, 1] -> (T, H, W, 3) uint8 RGB, on the video's device."""
    return ((video[0].permute(1, 2, 3, 0) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)


def frames_of_latents(first_latent: int, count: int, t: int) -> tuple[int, int]:
    """Video frame range ``[start, end)`` decoded from latent frames ``first_latent .. + count``."""

    def start(i: int) -> int:
        return 0 if i == 0 else 1 + t * (i - 1)

    return start(first_latent), start(first_latent + count)


def latents_for_frames(num_frames: int, t: int) -> int:
    """Latent frames needed to decode at least ``num_frames`` video frames."""
    return 1 + max(0, -(-(num_frames - 1) // t))


class StreamingDecoder:
    """Decodes normalised latents chunk by chunk into video in [-1, 1], (B, 3, T, H, W)."""

    def __init__(self, vae) -> None:
        self.vae = vae
        self.mean, self.std = latent_stats(vae)

    def reset(self) -> None:
        """Forget the state of the previous video."""

    def _denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        vae_dtype = next(self.vae.parameters()).dtype
        z = latents.float() * self.std.to(latents.device) + self.mean.to(latents.device)
        return z.to(vae_dtype)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, first_latent_index: int) -> torch.Tensor:
        raise NotImplementedError

    def state(self) -> dict[str, torch.Tensor]:
        """Tensors to save for resuming (empty when stateless)."""
        return {}

    def load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        pass


class LiteStreamingDecoder(StreamingDecoder):
    def __init__(self, vae) -> None:
        super().__init__(vae)
        self.context = int(getattr(vae.config, "decoder_context", 0) or 0)
        self.previous: torch.Tensor | None = None  # with context: the last latent frame decoded

    def reset(self) -> None:
        self.previous = None

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, first_latent_index: int) -> torch.Tensor:
        z = self._denormalize(latents)
        previous = self.previous if first_latent_index else None
        if self.context and first_latent_index and previous is None:
            raise RuntimeError(f"decoding from latent frame {first_latent_index} needs the frame before it")
        video = self.vae.decode(z, first_latent_index=first_latent_index, previous=previous).sample.float()
        if self.context:
            self.previous = z[:, :, -1:].clone()
        return video

    def state(self) -> dict[str, torch.Tensor]:
        return {"lite_previous": self.previous.contiguous()} if self.previous is not None else {}

    def load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self.previous = tensors.get("lite_previous")


class WanStreamingDecoder(StreamingDecoder):
    """Carries ``AutoencoderKLWan``'s causal convolution cache across chunks."""

    _REPEAT = "Rep"  # diffusers' marker for "first chunk: repeat the frame" in its cache

    def reset(self) -> None:
        self.vae.clear_cache()

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, first_latent_index: int) -> torch.Tensor:
        vae = self.vae
        if first_latent_index == 0:
            vae.clear_cache()
        x = vae.post_quant_conv(self._denormalize(latents))
        outputs = []
        for i in range(x.shape[2]):
            vae._conv_idx = [0]
            outputs.append(
                vae.decoder(
                    x[:, :, i : i + 1],
                    feat_cache=vae._feat_map,
                    feat_idx=vae._conv_idx,
                    first_chunk=first_latent_index + i == 0,
                )
            )
        video = torch.cat(outputs, dim=2)
        if getattr(vae.config, "patch_size", None) is not None:
            from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

            video = unpatchify(video, patch_size=vae.config.patch_size)
        return video.clamp(-1.0, 1.0).float()

    def state(self) -> dict[str, torch.Tensor]:
        out = {}
        for i, entry in enumerate(self.vae._feat_map):
            if isinstance(entry, torch.Tensor):
                out[f"wan_cache.{i}"] = entry.contiguous()
            elif entry == self._REPEAT:
                out[f"wan_cache_rep.{i}"] = torch.zeros(1)
        out["wan_cache_len"] = torch.tensor([len(self.vae._feat_map)])
        return out

    def load_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self.vae.clear_cache()
        length = int(tensors["wan_cache_len"][0])
        cache: list = [None] * length
        for i in range(length):
            if f"wan_cache.{i}" in tensors:
                cache[i] = tensors[f"wan_cache.{i}"]
            elif f"wan_cache_rep.{i}" in tensors:
                cache[i] = self._REPEAT
        self.vae._feat_map = cache


def streaming_decoder(vae) -> StreamingDecoder:
    if type(vae).__name__ == "AutoencoderKLWan":
        return WanStreamingDecoder(vae)
    return LiteStreamingDecoder(vae)


@torch.no_grad()
def encode_video(vae, video: torch.Tensor) -> torch.Tensor:
    """Frames (B, 3, T, H, W) in [-1, 1], T = 1 + t*k -> normalised latents (posterior mode)."""
    mean, std = latent_stats(vae, device=video.device)
    vae_dtype = next(vae.parameters()).dtype
    z = vae.encode(video.to(vae_dtype)).latent_dist.mode().float()
    return (z - mean) / std
