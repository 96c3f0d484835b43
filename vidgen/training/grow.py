"""Function-preserving growth of a trained causal transformer: more blocks, a wider feed-forward.

A grown model computes exactly what its source computes, so training it goes on from the source's
function with room to learn more (issue 52's capacity study; Net2Net's idea, Chen et al. 2016,
made exact here by zero output projections instead of split units):

- **Depth.** New blocks are inserted evenly between the source's. Each is a copy of the block before
  it with the three projections that write into the residual stream (self-attention's and
  cross-attention's ``to_out``, the feed-forward's second linear) set to zero: the block adds
  nothing, so the stream passes it unchanged. Gradients reach those projections at once (their
  inputs are the copied block's features), and through them the rest of the block.
- **Width.** A wider feed-forward keeps the source's hidden units; the new units' input weights
  are the fresh model's random ones and their output weights zero, so they add nothing until
  trained.

Everything outside the blocks is copied; per-layer tables (the text velocity's per-head gains) take
the row of the block each new one copies.
"""

from __future__ import annotations

import torch

from vidgen.models import CausalWanTransformer

# the projections whose outputs are added to the residual stream: zero makes a block the identity
_RESIDUAL_WRITERS = ("attn1.to_out.0", "attn2.to_out.0", "ffn.net.2")
_PER_LAYER_TABLES = ("velocity_gain",)


def source_of_blocks(source_layers: int, target_layers: int) -> list[tuple[int, bool]]:
    """For each block of the grown model, the source block it starts from and whether it is a
    copy (an inserted, identity block) rather than the source block itself. The inserted blocks
    are spread evenly: each follows the source block it copies."""
    if target_layers < source_layers:
        raise ValueError(
            f"a grown model has at least its source's {source_layers} blocks, not {target_layers}"
        )
    extra = target_layers - source_layers
    plan: list[tuple[int, bool]] = []
    for i in range(source_layers):
        plan.append((i, False))
        # the k-th inserted block goes after source block ceil((k + 1) * source / extra) - 1
        copies = sum(1 for k in range(extra) if -(-(k + 1) * source_layers // extra) - 1 == i)
        plan.extend((i, True) for _ in range(copies))
    return plan


@torch.no_grad()
def grow(
    source: CausalWanTransformer, num_layers: int, ffn_dim: int, *, seed: int = 0
) -> CausalWanTransformer:
    """A model of ``num_layers`` blocks with feed-forwards ``ffn_dim`` wide that computes what
    ``source`` computes (to float rounding: the same sums in the same order where nothing was
    added; measured bitwise equal on CPU). ``seed`` draws the new feed-forward units' input weights."""
    config = dict(source.config)
    old_layers, old_ffn = config["num_layers"], config["ffn_dim"]
    if ffn_dim < old_ffn:
        raise ValueError(
            f"a grown model's feed-forward is at least its source's {old_ffn} wide, not {ffn_dim}"
        )
    plan = source_of_blocks(old_layers, num_layers)
    config.update(num_layers=num_layers, ffn_dim=ffn_dim)
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        target = type(source).from_config(config)
    old = source.state_dict()
    new = target.state_dict()
    grown: dict[str, torch.Tensor] = {}
    for name, value in new.items():
        if not name.startswith("blocks."):
            if name in _PER_LAYER_TABLES:
                grown[name] = old[name][[i for i, _ in plan]].clone()
            else:
                grown[name] = old[name].clone()
            continue
        _, index, rest = name.split(".", 2)
        src, inserted = plan[int(index)]
        weight = old[f"blocks.{src}.{rest}"]
        if inserted and rest.rsplit(".", 1)[0] in _RESIDUAL_WRITERS:
            grown[name] = torch.zeros_like(value)
        elif rest.startswith("ffn.net.0.proj.") and ffn_dim > old_ffn:
            wide = value.clone()  # the new units' random input weights and biases
            wide[:old_ffn] = weight
            grown[name] = wide
        elif rest == "ffn.net.2.weight" and ffn_dim > old_ffn:
            wide = torch.zeros_like(value)
            wide[:, :old_ffn] = weight
            grown[name] = wide
        else:
            grown[name] = weight.clone()
    target.load_state_dict(grown)
    return target
