"""Weight quantization of the transformer's (and text encoder's) linear layers, through torchao.

``quantize_linears(module, "int8")`` swaps the weight of every ``nn.Linear`` inside the module's
blocks for a torchao tensor subclass, in place (``torchao.quantization.quantize_``, the same call
diffusers' ``TorchAoConfig`` makes):

* ``int8``: int8 weight-only (``Int8WeightOnlyConfig``), per output channel; the matmul runs in the
  activations' dtype. Works on CPU and GPU.
* ``fp8``: on a CUDA GPU of compute capability 8.9 or above (Ada, Hopper, Blackwell), fp8 e4m3
  weights and per-row dynamically quantized fp8 activations (``Float8DynamicActivationFloat8Weight
  Config``): the matmuls run on fp8 tensor cores. Elsewhere (CPU, older GPUs) fp8 is *emulated*:
  weights are stored in fp8 e4m3 (``Float8WeightOnlyConfig``) and widened for each matmul, which
  saves the memory but not the time.

The patch embedding, time/text embedders and output head stay in their dtype: they are under 5% of
the weights of any Wan size and sit where errors reach every token. torchao is an optional
dependency (``pip install 'vidgen[quantize]'``), imported only when a quantization is asked for.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from torch import nn

from vidgen.config import ConfigError

QuantizeKind = Literal["none", "int8", "fp8"]


class QuantizationUnavailable(ConfigError):
    """A quantization that cannot run here; the message says why and what to do."""


def _torchao():
    # torchao logs a warning for every CUDA kernel library it cannot load (all of them on a CPU
    # build): not the user's concern, since the kernels we use are plain PyTorch there.
    logger = logging.getLogger("torchao")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import torchao.quantization as quantization
    except ImportError as err:
        raise QuantizationUnavailable(
            f"runtime.quantize needs torchao ({err}): pip install 'vidgen[quantize]'"
        ) from None
    finally:
        logger.setLevel(level)
    return quantization


def fp8_native(device: torch.device | str) -> bool:
    """Whether ``device`` multiplies fp8 matrices in hardware (CUDA compute capability >= 8.9)."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def method(kind: QuantizeKind, device: torch.device | str) -> str:
    """What ``kind`` does on ``device``, in words (for logs and benchmarks)."""
    if kind == "int8":
        return "int8 weight-only"
    if kind == "fp8":
        return "fp8 weights and activations" if fp8_native(device) else "fp8 weight-only (emulated)"
    return "none"


def _config(kind: QuantizeKind, device: torch.device):
    q = _torchao()
    if kind == "int8":
        return q.Int8WeightOnlyConfig()
    if kind == "fp8":
        if fp8_native(device):
            return q.Float8DynamicActivationFloat8WeightConfig(granularity=q.PerRow())
        return q.Float8WeightOnlyConfig()
    raise ValueError(f"quantization must be 'int8' or 'fp8', got {kind!r}")


def quantize_linears(
    module: nn.Module, kind: QuantizeKind, *, device: torch.device | str | None = None, under: str = "blocks."
) -> int:
    """Quantize, in place, every ``nn.Linear`` whose name starts with ``under`` (``""``: all of
    them); returns how many. ``device``: where the module will run (default: where it is)."""
    if kind == "none":
        return 0
    if device is None:
        device = next(module.parameters()).device
    config = _config(kind, torch.device(device))
    names = {
        name
        for name, child in module.named_modules()
        if isinstance(child, nn.Linear) and name.startswith(under) and child.weight.ndim == 2
    }
    if not names:
        return 0
    # torchao's fp8 kernels need the weight on the device that will run them
    _torchao().quantize_(module, config, filter_fn=lambda _, fqn: fqn in names, device=device)
    return len(names)


def weight_bytes(module: nn.Module) -> int:
    """Bytes the module's parameters and buffers take, counting a quantized weight by what it
    stores (its integer or fp8 data plus scales)."""

    def nbytes(tensor: torch.Tensor) -> int:
        if hasattr(tensor, "__tensor_flatten__") and type(tensor) not in (torch.Tensor, nn.Parameter):
            inner, _ = tensor.__tensor_flatten__()
            return sum(nbytes(getattr(tensor, name)) for name in inner)
        return tensor.numel() * tensor.element_size()

    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    return sum(nbytes(t) for t in tensors.values())
