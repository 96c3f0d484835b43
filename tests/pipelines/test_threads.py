"""runtime.threads = 0: the thread count follows OMP_NUM_THREADS, a count the user set, or the idle CPUs."""

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
        auto_threads(default_threads, cpus=64, load=0.0, env=None) == default_threads
    )  # never above torch's


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
