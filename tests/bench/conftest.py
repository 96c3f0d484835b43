"""The fixtures the benchmarks' tests share with the parts they measure."""

from tests.attention.conftest import _clean_env  # noqa: F401 - autouse: no backend forced from outside
from tests.distributed.conftest import ray_cluster, tiny_model_dir  # noqa: F401
