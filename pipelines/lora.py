"""LoRA on ``LongVideoPipeline``, the diffusers way: diffusers' ``WanLoraLoaderMixin`` with its names
and meanings (``load_lora_weights``, ``set_adapters``, ``fuse_lora``, ``unfuse_lora``,
``unload_lora_weights``), reading only local files, accepting the layouts of
:mod:`vidgen.models.lora`, and checking every key against the transformer before loading.

Config LoRAs (``[model] loras``, ``vidgen render --lora``) are loaded, weighted, fused into the
transformer and their layers dropped (:meth:`LongVideoLoraLoaderMixin.apply_config_loras`): the
model then runs as fast as the base one, compiles and shards like it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from diffusers.loaders import WanLoraLoaderMixin

from vidgen.config import parse_lora_spec
from vidgen.models.lora import check_lora_keys, normalize_lora_state_dict, read_lora_file
from vidgen.pipelines import hub
from vidgen.pipelines.loading import ModelLoadError, check_finite

if TYPE_CHECKING:  # pragma: no cover
    from vidgen.attention.cache import LRUCache
    from vidgen.models import CausalWanTransformer, TextContext


def _lora_file(path: Path) -> Path:
    """A LoRA file, or the single safetensors / .pt file of a folder (diffusers saves
    ``pytorch_lora_weights.safetensors``)."""
    if path.is_dir():
        files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.pt"))
        if len(files) != 1:
            raise ModelLoadError(f"{path}: expected one LoRA .safetensors or .pt file, found {len(files)}")
        return files[0]
    if not path.is_file():
        raise ModelLoadError(f"no LoRA file at {path} (a Hugging Face id is owner/name/file)")
    return path


class LongVideoLoraLoaderMixin(WanLoraLoaderMixin):
    """diffusers' Wan LoRA loader for a pipeline whose only LoRA-able component is ``transformer``."""

    _lora_loadable_modules = ["transformer"]
    hf_device_map = None  # read by diffusers' offload handling while an adapter loads
    # the pipeline this mixes into sets these
    transformer: CausalWanTransformer
    vae: Any
    text_encoder: Any
    _text_contexts: LRUCache[TextContext]

    @property
    def components(self) -> dict:
        return {"transformer": self.transformer, "vae": self.vae, "text_encoder": self.text_encoder}

    # the overrides below take what vidgen supports (local files, transformer-only weights), a
    # narrower signature than diffusers' on purpose
    @classmethod
    def lora_state_dict(  # type: ignore[override]
        cls, pretrained_model_name_or_path_or_dict: str | os.PathLike | dict[str, torch.Tensor], **kwargs
    ):
        """A LoRA (a local file or folder, a hub id ``owner/name/file``, or a state dict) in
        diffusers' ``transformer.*`` keys; ``.pt`` files are read with ``torch.load(weights_only=True)``."""
        return_metadata = kwargs.pop("return_lora_metadata", False)
        weight_name = kwargs.pop("weight_name", None)  # a file inside a folder, as in diffusers
        source = pretrained_model_name_or_path_or_dict
        try:
            if isinstance(source, dict):
                state = normalize_lora_state_dict(source)
            else:
                reference = hub.hub_reference(source)
                if weight_name and reference is not None and reference[1] is None:
                    path = _lora_file(hub.fetch_file(reference[0], weight_name))
                else:
                    path = hub.resolve(source)
                    path = _lora_file(path / weight_name if weight_name else path)
                state = normalize_lora_state_dict(read_lora_file(path))
                check_finite(state, f"the LoRA {path}")
        except ModelLoadError:
            raise
        except (OSError, ValueError) as err:
            raise ModelLoadError(f"cannot read the LoRA {_name(source)}: {err}") from None
        return (state, None) if return_metadata else state

    def load_lora_weights(  # type: ignore[override]
        self,
        pretrained_model_name_or_path_or_dict: str | os.PathLike | dict[str, torch.Tensor],
        adapter_name: str | None = None,
        hotswap: bool = False,
        **kwargs,
    ) -> None:
        """Load a LoRA into the transformer as adapter ``adapter_name`` (default: ``default_N``).
        Raises :class:`ModelLoadError` naming the keys that do not fit the transformer."""
        state = self.lora_state_dict(
            pretrained_model_name_or_path_or_dict, weight_name=kwargs.pop("weight_name", None)
        )
        try:
            check_lora_keys(self.transformer, state)
        except ValueError as err:
            raise ModelLoadError(
                f"cannot load the LoRA {_name(pretrained_model_name_or_path_or_dict)}: {err}"
            ) from None
        super().load_lora_weights(state, adapter_name=adapter_name, hotswap=hotswap, **kwargs)
        self._lora_changed()

    def set_adapters(  # type: ignore[override]
        self, adapter_names: list[str] | str, adapter_weights: float | list[float] | None = None
    ) -> None:
        super().set_adapters(adapter_names, adapter_weights)
        self._lora_changed()

    def fuse_lora(  # type: ignore[override]
        self, components: list[str] | None = None, lora_scale: float = 1.0, **kwargs
    ) -> None:
        super().fuse_lora(components=components or ["transformer"], lora_scale=lora_scale, **kwargs)
        self._lora_changed()

    def unfuse_lora(self, components: list[str] | None = None, **kwargs) -> None:
        super().unfuse_lora(components=components or ["transformer"], **kwargs)
        self._lora_changed()

    def unload_lora_weights(self) -> None:
        super().unload_lora_weights()
        self._lora_changed()

    def delete_adapters(self, adapter_names: list[str] | str) -> None:
        super().delete_adapters(adapter_names)
        self._lora_changed()

    def enable_lora(self) -> None:
        super().enable_lora()
        self._lora_changed()

    def disable_lora(self) -> None:
        super().disable_lora()
        self._lora_changed()

    def _lora_changed(self) -> None:
        # cached cross-attention keys/values were projected with the previous weights
        self._text_contexts.clear()

    def apply_config_loras(self, specs: list[str]) -> None:
        """Load ``PATH[:SCALE]`` LoRAs, weight them, fuse them into the transformer and drop their
        layers (the config's LoRAs are part of the model, not switchable adapters)."""
        if not specs:
            return
        names, scales = [], []
        for i, spec in enumerate(specs):
            path, scale = parse_lora_spec(spec)
            names.append(f"config_{i}")
            scales.append(scale)
            self.load_lora_weights(path, adapter_name=names[-1])
        self.set_adapters(names, scales)
        self.fuse_lora(adapter_names=names)
        self.unload_lora_weights()


def _name(source) -> str:
    return "state dict" if isinstance(source, dict) else str(source)
