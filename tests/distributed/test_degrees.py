"""Parallel degrees that cannot work fail up front, saying what to change."""

import pytest
import torch

from tests.models.conftest import TINY
from vidgen.distributed import ParallelConfig, SequenceParallelGroup, init_process_group, validate_degrees
from vidgen.models import CausalWanTransformer

MODEL = {**TINY, "num_attention_heads": 3}


def test_good_degrees_pass():
    validate_degrees(MODEL, sp=3, replicas=2, world_size=6, frame_tokens=12, kind="ulysses")
    validate_degrees(MODEL, sp=2, replicas=1, world_size=2, frame_tokens=12, kind="ring")


@pytest.mark.parametrize(
    "args, message",
    [
        ((2, 2, 3, None, "ring"), r"world size 3 != sp 2 x replicas 2 = 4: launch 4 processes"),
        ((2, 1, 2, None, "ulysses"), r"3 attention heads across sp=2.*sp in \(1, 3\), or ring attention"),
        ((4, 1, 4, 6, "ring"), r"6 tokens, not divisible by sp=4: use sp in \(1, 2, 3, 6\)"),
        ((0, 1, 0, None, "ring"), r"sp must be an integer >= 1"),
        ((2, 1, 2, None, "spiral"), r"kind='spiral' is unknown; choose one of ulysses, ring"),
    ],
)
def test_bad_degrees_raise_clear_errors(args, message):
    sp, replicas, world, frame_tokens, kind = args
    with pytest.raises(ValueError, match=message):
        validate_degrees(MODEL, sp, replicas, world, frame_tokens, kind)


def test_parallel_config_checks_its_fields():
    assert ParallelConfig(sp=2, replicas=3).world_size == 6
    with pytest.raises(ValueError, match="replicas must be an integer >= 1"):
        ParallelConfig(sp=2, replicas=0)


def test_init_refuses_a_world_that_is_not_whole_groups(tmp_path):
    with pytest.raises(ValueError, match=r"world size 3 is not a whole number of sp=2 groups"):
        init_process_group(0, 3, f"file://{tmp_path / 'rendezvous'}", sp=2)


def test_model_refuses_shards_it_cannot_run():
    """Caught before any collective: a group of 2 that never talks is enough."""
    torch.manual_seed(0)
    model = CausalWanTransformer(**MODEL).eval()
    ulysses = SequenceParallelGroup(group=None, rank=0, size=2, kind="ulysses")
    x, t, text = torch.randn(1, 4, 2, 4, 4), torch.tensor([5.0]), torch.randn(1, 7, TINY["text_dim"])
    with torch.no_grad(), pytest.raises(ValueError, match="3 attention heads across sp=2"):
        model(x, t, text, sequence_parallel=ulysses)
    with pytest.raises(ValueError, match="3 attention heads across sp=2"):
        ulysses.make_kv_cache(
            model, batch_size=1, latent_height=4, latent_width=4, sink_frames=1, window_frames=2
        )
    ring = SequenceParallelGroup(group=None, rank=0, size=3, kind="ring")
    with torch.no_grad(), pytest.raises(ValueError, match="4 tokens, not divisible by sp=3"):
        model(x, t, text, sequence_parallel=ring)
    cache = model.make_kv_cache(batch_size=1, latent_height=4, latent_width=4, sink_frames=1, window_frames=2)
    ring2 = SequenceParallelGroup(group=None, rank=0, size=2, kind="ring")
    with torch.no_grad(), pytest.raises(ValueError, match="holds 4 tokens per frame but the input needs 2"):
        model(x, t, text, kv_cache=cache, sequence_parallel=ring2)
    two_heads = CausalWanTransformer(**{**MODEL, "num_attention_heads": 2}).eval()
    whole = two_heads.make_kv_cache(
        batch_size=1, latent_height=4, latent_width=4, sink_frames=1, window_frames=2
    )
    ulysses2 = SequenceParallelGroup(group=None, rank=0, size=2, kind="ulysses")
    with torch.no_grad(), pytest.raises(ValueError, match="holds 2 heads but ulysses attention .* needs 1"):
        two_heads(x, t, text, kv_cache=whole, sequence_parallel=ulysses2)


def test_training_through_the_collectives_is_refused():
    torch.manual_seed(0)
    model = CausalWanTransformer(**{**TINY, "num_attention_heads": 2})
    group = SequenceParallelGroup(group=None, rank=0, size=2, kind="ring")
    with pytest.raises(NotImplementedError, match="inference only"):
        model(torch.randn(1, 4, 2, 4, 4), torch.tensor([5.0]), torch.randn(1, 7, 16), sequence_parallel=group)


def test_an_address_where_nothing_listens_is_refused_within_seconds():
    """``--address`` with nothing listening: one line within seconds, not Ray's minutes of retries
    (checked before Ray is started, so no cluster is touched)."""
    import socket
    import time

    from vidgen.distributed.ray_cluster import check_reachable
    from vidgen.validation import InputError

    with socket.socket() as probe:  # a loopback port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(InputError, match=f"--address {address}: nothing answers there"):
            check_reachable(address)
    assert time.monotonic() - started < 10
    with socket.socket() as server:  # something listening passes
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}")
    check_reachable("auto")  # left to Ray
