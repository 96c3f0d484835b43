"""Function-preserving growth (``vidgen train transformer --grow-from``): the grown model computes
exactly what its source computes, with its new blocks spread between the source's."""

import pytest
import torch

from tests.tiny import TINY_TRANSFORMER
from vidgen.models.extensions import ConditionedWanTransformer
from vidgen.training.grow import grow, source_of_blocks


@pytest.mark.parametrize(
    "source, target, plan",
    [
        (8, 12, [0, 1, "1", 2, 3, "3", 4, 5, "5", 6, 7, "7"]),
        (8, 9, [0, 1, 2, 3, 4, 5, 6, 7, "7"]),
        (2, 6, [0, "0", "0", 1, "1", "1"]),
        (3, 3, [0, 1, 2]),
    ],
)
def test_inserted_blocks_are_spread_between_the_sources(source, target, plan):
    got = [str(i) if copy else i for i, copy in source_of_blocks(source, target)]
    assert got == plan


def test_a_grown_model_computes_what_its_source_computes():
    """Every addition on and non-zero (per-layer velocity gains copied to the new blocks), deeper and
    wider: the same output bit for bit, and a different one once the new blocks' zeroed output
    projections move (so the test sees the blocks, not a model that ignores them)."""
    torch.manual_seed(0)
    source = ConditionedWanTransformer(
        **{**TINY_TRANSFORMER, "num_layers": 3},
        spatial_pos_grid=(4, 4),
        text_modulation=True,
        text_velocity=True,
    ).eval()
    with torch.no_grad():
        source.velocity_gain.normal_()
        source.spatial_pos.normal_(0, 0.1)
        source.text_to_modulation.weight.normal_(0, 0.05)
        source.text_to_velocity.value.weight.normal_(0, 0.1)
    grown = grow(source, num_layers=5, ffn_dim=2 * TINY_TRANSFORMER["ffn_dim"]).eval()
    assert (grown.config.num_layers, grown.config.ffn_dim) == (5, 128)
    assert sum(p.numel() for p in grown.parameters()) > sum(p.numel() for p in source.parameters())
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 3, 8, 8, generator=g)
    text = torch.randn(2, 7, TINY_TRANSFORMER["text_dim"], generator=g)
    t = torch.tensor([300.0, 800.0])
    with torch.no_grad():
        expected = source(x, t, text).sample
        assert torch.equal(grown(x, t, text).sample, expected)
        grown.blocks[1].ffn.net[2].weight.normal_(0, 0.1)  # block 1 is the copy of block 0
        assert not torch.allclose(grown(x, t, text).sample, expected)


def test_a_grown_model_is_never_smaller():
    source = ConditionedWanTransformer(**TINY_TRANSFORMER)
    with pytest.raises(ValueError, match="at least its source's 2 blocks"):
        grow(source, num_layers=1, ffn_dim=64)
    with pytest.raises(ValueError, match="at least its source's 64 wide"):
        grow(source, num_layers=2, ffn_dim=32)
