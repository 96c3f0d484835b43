"""The Wan 2.1 path end to end with tiny random parts: diffusers-layout folder, UMT5 text encoder,
AutoencoderKLWan with streaming decode, the wan2.1-t2v-1.3b-causal preset's chunking."""

import json

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

from vidgen.pipelines import LongVideoPipeline


def _tiny_wan_folder(root):
    """A folder laid out like Wan2.1-T2V-1.3B-Diffusers, with tiny random weights."""
    torch.manual_seed(0)
    words = [
        "<pad>",
        "</s>",
        "<unk>",
        "a",
        "red",
        "blue",
        "circle",
        "square",
        "moving",
        "left",
        "on",
        "black",
        "background",
    ]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(root / "tokenizer")
    UMT5EncoderModel(
        UMT5Config(vocab_size=len(words), d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)
    ).save_pretrained(root / "text_encoder")
    WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=4,
        out_channels=4,
        text_dim=32,
        freq_dim=32,
        ffn_dim=32,
        num_layers=2,
        rope_max_seq_len=64,
    ).save_pretrained(root / "transformer")
    AutoencoderKLWan(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    ).save_pretrained(root / "vae")
    (root / "model_index.json").write_text(
        json.dumps({"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"]})
    )
    return root


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    folder = _tiny_wan_folder(tmp_path_factory.mktemp("wan"))
    overrides = {
        "generation.height": 32,
        "generation.width": 48,
        "model.text_max_length": 16,
        "runtime.dtype": "float32",
        "runtime.device": "cpu",
    }
    return LongVideoPipeline.from_pretrained(folder, config="wan2.1-t2v-1.3b-causal", **overrides)


def test_wan_folder_loads_with_the_preset(wan):
    assert wan.config.model.text_encoder == "umt5" and type(wan.vae).__name__ == "AutoencoderKLWan"
    assert wan.config.generation.chunk_frames == 3 and wan.temporal_factor == 4


def test_wan_stream_equals_call_and_decodes_causally(wan):
    prompt = "a red circle moving left on a black background"
    out = wan(prompt, num_frames=33, generator=0).frames
    assert out.shape == (33, 32, 48, 3)
    chunks = list(wan.stream(prompt, num_frames=33, generator=0, return_latents=True))
    assert np.array_equal(np.concatenate([c.frames for c in chunks]).astype(np.float32) / 255, out)
    # decoding all latents at once gives the chunk-by-chunk frames
    latents = torch.cat([c.latents for c in chunks], dim=2)
    mean = torch.tensor(wan.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(wan.vae.config.latents_std).view(1, -1, 1, 1, 1)
    whole = wan.vae.decode(latents * std + mean).sample
    frames = ((whole[0].permute(1, 2, 3, 0) + 1) * 127.5).round().clamp(0, 255).byte().numpy()[:33]
    assert np.abs(frames.astype(int) - (out * 255).round().astype(int)).max() <= 1


def test_original_layout_transformer_replaces_the_folders(wan, tmp_path):
    from safetensors.torch import save_file

    from tests.models.test_wan_checkpoint import _to_original_layout

    state = {"model." + k: v for k, v in _to_original_layout(wan.transformer.state_dict()).items()}
    save_file(state, str(tmp_path / "causal.safetensors"))
    folder = wan.config.model.path
    assert folder == ""  # the preset's own field: the folder came from the argument
    reloaded = LongVideoPipeline.from_pretrained(
        _tiny_wan_folder(tmp_path / "again"),
        config="wan2.1-t2v-1.3b-causal",
        **{
            "model.transformer": str(tmp_path / "causal.safetensors"),
            "generation.height": 32,
            "generation.width": 48,
            "model.text_max_length": 16,
            "runtime.dtype": "float32",
            "runtime.device": "cpu",
        },
    )
    prompt = "a blue square"
    assert np.array_equal(
        reloaded(prompt, num_frames=9, generator=1).frames, wan(prompt, num_frames=9, generator=1).frames
    )
