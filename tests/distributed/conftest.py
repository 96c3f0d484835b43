"""Fixtures for the Ray tests: ONE local Ray instance per test session (2 CPUs, bound to 127.0.0.1,
no dashboard) and a tiny pipeline folder the Ray workers load
(float32: the tests compare the workers' frames with one process's, see ``assert_frames_match``)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    import importlib.util

    from vidgen.distributed.ray_cluster import connect

    if importlib.util.find_spec("ray") is None:  # not importorskip: ray must not be imported yet
        pytest.skip("ray is not installed (pip install 'vidgen[distributed]')")
    started = connect(num_cpus=2)  # loopback only, no dashboard (see ray_cluster.loopback_only)
    import ray

    yield ray
    if started == "local":
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from tests.tiny import FP32, save_tiny_pipeline

    return save_tiny_pipeline(tmp_path_factory.mktemp("tiny") / "pipeline", **FP32)
