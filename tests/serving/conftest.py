"""The Ray fixtures of the distributed tests (one local Ray instance, a tiny pipeline folder)."""

from tests.distributed.conftest import ray_cluster, tiny_model_dir  # noqa: F401
