"""vidgen.attention: one attention entry point over named backends, with patterns as data.

Layout everywhere: ``(B, S, H, D)`` (batch, sequence, heads, head dim).

    from vidgen.attention import AttentionPattern, dispatch_attention

    pattern = AttentionPattern.sliding_window(frame_tokens=1560, chunk_frames=3, window_frames=9)
    out = dispatch_attention(q, k, v, pattern=pattern)  # (B, S_q, H, D)

When ``q`` is shorter than ``k``/``v`` (a chunk attending to a KV cache), the queries are the
last positions of the key sequence. Backends: ``sdpa`` (everywhere, autograd), ``flex``
(FlexAttention, block-sparse, compiled), ``flash`` and ``xformers`` (CUDA, optional installs);
see :func:`backend_status` for what is usable on this machine and why.
"""

from vidgen.attention.dispatch import (
    ENV_VAR,
    BackendUnavailableError,
    attention_backend,
    dispatch_attention,
    select_backend,
)
from vidgen.attention.patterns import AttentionPattern, ChunkKeyRanges, PatternKind
from vidgen.attention.registry import (
    AttentionBackend,
    BackendStatus,
    available_backends,
    backend_status,
    get_backend,
    register_backend,
    registered_backends,
)

__all__ = [
    "ENV_VAR",
    "AttentionBackend",
    "AttentionPattern",
    "BackendStatus",
    "BackendUnavailableError",
    "ChunkKeyRanges",
    "PatternKind",
    "attention_backend",
    "available_backends",
    "backend_status",
    "dispatch_attention",
    "get_backend",
    "register_backend",
    "registered_backends",
    "select_backend",
]
