"""``pipe.compile()``: the transformer's blocks as one graph without breaks, equal to eager."""

import pytest
import torch

from tests.tiny import FP32, tiny_components

PROMPT = "a red circle moving left on a black background"


@pytest.mark.slow  # about a minute: four graphs compiled on the CPU
def test_compiled_blocks_equal_eager_over_a_sliding_window():
    # 8 chunks of 2 latent frames against 2 sinks + a 4-frame window: the window slides from the
    # fourth chunk on, so the rolling rope shift and the ring slots both move under the graphs
    pipe = tiny_components(**FP32)
    eager = pipe(PROMPT, num_frames=56, generator=0, output_type="latent").frames
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    pipe.compile()
    compiled = pipe(PROMPT, num_frames=56, generator=0, output_type="latent").frames
    counters = torch._dynamo.utils.counters
    assert not counters["graph_break"], dict(counters["graph_break"])
    # one graph per number of held frames (0, 2, 4, 6), the same ones for every chunk after
    assert counters["stats"]["unique_graphs"] == 4, dict(counters["stats"])
    assert eager.shape == compiled.shape and eager.shape[2] == 16
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
