"""Synthetic LoRAs for tests: random low-rank factors for layers of a tiny transformer, the state
dict of each published layout, and the reference -- the weights merged by hand in float64."""

import copy

import torch

RANK = 4
# original Wan name -> diffusers name of every linear layer of a block (LongLive's adapter targets)
BLOCK_LINEARS = {
    "self_attn.q": "attn1.to_q",
    "self_attn.k": "attn1.to_k",
    "self_attn.v": "attn1.to_v",
    "self_attn.o": "attn1.to_out.0",
    "cross_attn.q": "attn2.to_q",
    "cross_attn.k": "attn2.to_k",
    "cross_attn.v": "attn2.to_v",
    "cross_attn.o": "attn2.to_out.0",
    "ffn.0": "ffn.net.0.proj",
    "ffn.2": "ffn.net.2",
}


def synthetic_lora(model, targets: dict[str, str], alpha: float | None = None, seed: int = 2):
    """``{module (diffusers name): (A, B, alpha)}`` of random rank-4 factors."""
    g = torch.Generator().manual_seed(seed)
    lora = {}
    for i in range(len(model.blocks)):
        for ours in targets.values():
            layer = model.get_submodule(f"blocks.{i}.{ours}")
            a = torch.randn(RANK, layer.in_features, generator=g) * 0.2
            b = torch.randn(layer.out_features, RANK, generator=g) * 0.2
            lora[f"blocks.{i}.{ours}"] = (a, b, alpha if alpha is not None else float(RANK))
    return lora


def merged_by_hand(model, lora, scale: float = 1.0):
    """W + scale * alpha / r * B @ A in float64, for every layer of the LoRA."""
    merged = copy.deepcopy(model)
    with torch.no_grad():
        for name, (a, b, alpha) in lora.items():
            layer = merged.get_submodule(name)
            delta = scale * alpha / a.shape[0] * (b.double() @ a.double())
            layer.weight.copy_((layer.weight.double() + delta).float())
    return merged


def diffusers_layout(lora, with_alpha: bool = False):
    """``transformer.blocks.N.attn1.to_q.lora_A.weight``: diffusers / peft (alpha = rank unless
    ``.alpha`` keys are written)."""
    state = {}
    for name, (a, b, alpha) in lora.items():
        state[f"transformer.{name}.lora_A.weight"] = a
        state[f"transformer.{name}.lora_B.weight"] = b
        if with_alpha:
            state[f"transformer.{name}.alpha"] = torch.tensor(alpha)
    return state


def original_layout(lora, prefix: str, with_alpha: bool, names=("lora_A", "lora_B")):
    """``{prefix}blocks.N.self_attn.q.lora_A.weight`` (+ ``.alpha``): the original Wan layout."""
    theirs = {v: k for k, v in BLOCK_LINEARS.items()}
    state = {}
    for name, (a, b, alpha) in lora.items():
        block, index, ours = name.split(".", 2)
        key = f"{prefix}{block}.{index}.{theirs[ours]}"
        state[f"{key}.{names[0]}.weight"] = a
        state[f"{key}.{names[1]}.weight"] = b
        if with_alpha:
            state[f"{key}.alpha"] = torch.tensor(alpha)
    return state
