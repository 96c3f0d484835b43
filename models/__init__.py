"""Models of vidgen: the causal Wan transformer, its KV cache, autoencoders and text encoders."""

from vidgen.models.kv_cache import KVCache
from vidgen.models.rope import RopePositionMode
from vidgen.models.transformer import CausalWanTransformer, TextContext, drop_cast_weights

__all__ = ["CausalWanTransformer", "KVCache", "RopePositionMode", "TextContext", "drop_cast_weights"]
