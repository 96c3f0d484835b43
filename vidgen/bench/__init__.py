"""``vidgen bench``'s benchmarks, one module per target (``attention``, ``pipeline``,
``distributed``, ``quantize``), each with ``main(args) -> int``.

They sit above the library (they measure ``vidgen.attention``, ``vidgen.pipelines``,
``vidgen.distributed`` and build tiny models with ``vidgen.training``), so nothing in the
library imports them and matplotlib, which draws their plots, is imported only when one runs.
"""
