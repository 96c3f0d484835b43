"""runtime.threads = 0: the thread count follows OMP_NUM_THREADS, a count the user set, or the idle
CPUs; and a seed's frames do not depend on the count."""

import numpy as np
import pytest
import torch

from vidgen.pipelines import loading
from vidgen.pipelines.loading import auto_threads


@pytest.fixture
def default_threads():
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_idle_cpus_less_the_load(default_threads):
    assert auto_threads(default_threads, cpus=2, load=0.1, env=None) == min(default_threads, 2)
    assert auto_threads(default_threads, cpus=2, load=1.2, env=None) == 1  # one core busy elsewhere
    assert auto_threads(default_threads, cpus=2, load=5.0, env=None) == 1  # never below one
    assert (
        auto_threads(default_threads, cpus=64, load=0.0, env=None) <= default_threads
    )  # never above torch's
    # a power of two: the kernels' sums split alike for 1, 2, 4, 8, 16 threads, not for 3 or 6
    torch.set_num_threads(16)  # torch's own choice on a 16-core machine (the fixture restores it)
    assert auto_threads(16, cpus=64, load=0.0, env=None) == 16
    assert auto_threads(16, cpus=7, load=0.0, env=None) == 4
    assert auto_threads(16, cpus=8, load=2.2, env=None) == 4
    assert auto_threads(16, cpus=3, load=0.0, env=None) == 2


def test_the_users_choice_is_kept(default_threads):
    assert auto_threads(default_threads, cpus=2, load=1.2, env="2") is None  # OMP_NUM_THREADS
    torch.set_num_threads(default_threads + 1)  # set by the user before loading
    assert auto_threads(default_threads, cpus=2, load=1.2, env=None) is None


def test_decided_once_per_process(monkeypatch, default_threads):
    """A second pipeline of the process computes with the first one's count, whatever the load."""
    monkeypatch.setattr(loading, "_auto_decided", False)
    monkeypatch.setattr(loading, "_TORCH_DEFAULT_THREADS", 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    monkeypatch.setattr(loading.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(loading.os, "getloadavg", lambda: (1.3, 1.0, 1.0))
    loading.apply_threads(0)
    assert torch.get_num_threads() == 1
    monkeypatch.setattr(loading.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    torch.set_num_threads(2)
    loading.apply_threads(0)
    assert torch.get_num_threads() == 2  # not decided again: left as it is
    loading.apply_threads(1)  # an explicit count always applies
    assert torch.get_num_threads() == 1


def _with_threads(count: int, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def test_the_autoencoder_decodes_the_same_bits_with_1_and_2_threads():
    """oneDNN's convolution splits its sums by thread (the shipped decoder gave 1.5e-6 apart, and 48
    pixels of a 12-s video one level apart); the autoencoder's inference convolution does not."""
    from vidgen.models.autoencoder import AutoencoderKLLite
    from vidgen.pipelines.loading import default_model_dir

    vae = AutoencoderKLLite.from_pretrained(default_model_dir() / "vae").eval()
    latents = torch.randn(1, vae.config.z_dim, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    video = torch.rand(1, 3, 9, 64, 64, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        one = _with_threads(1, lambda: (vae.decode(latents).sample, vae.encode(video).latent_dist.mode()))
        two = _with_threads(2, lambda: (vae.decode(latents).sample, vae.encode(video).latent_dist.mode()))
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


def test_a_seed_makes_the_same_video_with_1_and_2_threads():
    """The README's promise: a seed fixes the video whatever the thread count (the load decides
    ``runtime.threads = 0``'s count, so a resumed render may run with another)."""
    from vidgen.pipelines import LongVideoPipeline

    pipe = LongVideoPipeline.from_pretrained(None, **{"runtime.threads": 1})

    def render():
        return pipe(
            "a fast cyan circle zips to the right over a gray background", seconds=6, generator=11
        ).frames

    one, two = _with_threads(1, render), _with_threads(2, render)
    assert one.shape == (96, 64, 64, 3) and np.array_equal(one, two)
