"""vidgen: long-form video generation with a causal, Wan 2.1-compatible diffusion transformer.

Nothing heavy happens at import: the public names below are resolved lazily.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

# diffusers imports torchao (the optional quantization backend) whenever it is installed; on a CPU
# build torchao logs a warning for each CUDA kernel library it cannot load, and diffusers one for
# checkpoint classes newer torchao versions dropped, and torch one per enum torchao registers with
# the deprecated pytree call. None of it concerns vidgen's use of torchao.
for _name in ("torchao", "diffusers.quantizers.torchao.torchao_quantizer", "torch.utils._pytree"):
    logging.getLogger(_name).setLevel(logging.ERROR)

__version__ = "0.1.0"

_LAZY = {
    "InputError": "vidgen.validation",
    "GenerationRequest": "vidgen.request",
    "LongVideoPipeline": "vidgen.pipelines",
    "VideoChunk": "vidgen.pipelines",
    "CausalWanTransformer": "vidgen.models",
    "KVCache": "vidgen.models",
    "dispatch_attention": "vidgen.attention",
    "AttentionPattern": "vidgen.attention",
    "export_to_video": "vidgen.video",
}

if TYPE_CHECKING:  # pragma: no cover
    from vidgen.attention import AttentionPattern, dispatch_attention
    from vidgen.models import CausalWanTransformer, KVCache
    from vidgen.pipelines import LongVideoPipeline, VideoChunk
    from vidgen.request import GenerationRequest
    from vidgen.validation import InputError
    from vidgen.video import export_to_video


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vidgen' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [  # noqa: F822 - resolved lazily by __getattr__
    "AttentionPattern",
    "CausalWanTransformer",
    "GenerationRequest",
    "InputError",
    "KVCache",
    "LongVideoPipeline",
    "VideoChunk",
    "__version__",
    "dispatch_attention",
    "export_to_video",
]
