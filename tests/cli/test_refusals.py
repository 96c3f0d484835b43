"""Issue 54's probe, case by case: each input that used to end in a traceback, a hang, an
out-of-memory or a silently wrong video is one line saying what to change, exit status 2, nothing
written, within seconds (the commands run in this process: an exception that escapes fails the
test). Resume damage is in ``test_resume_integrity.py``; the API's ``state_path`` in
``tests/pipelines/test_pipeline.py``."""

from __future__ import annotations

import json
import shlex
import struct
import time
import zlib
from pathlib import Path

import pytest
import torch

from tests.tiny import save_tiny_pipeline
from vidgen.cli import main
from vidgen.models import CausalWanTransformer


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    return make_inputs(tmp_path_factory.mktemp("inputs"))


def make_inputs(root: Path) -> dict[str, Path]:
    """The probe's input files under ``root`` (also ``benchmarks/refusal_costs.py``'s), by name."""
    made = {"model": save_tiny_pipeline(root / "model")}

    def png_header(width: int, height: int, name: str) -> None:
        """A PNG whose header claims ``width`` x ``height``: what a decoder would allocate."""

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        (root / name).write_bytes(data + chunk(b"IEND", b""))
        made[name] = root / name

    png_header(20000, 20000, "bomb.png")  # past PIL's decompression-bomb limit
    png_header(13000, 13000, "big.png")  # under it, but 169 megapixels to decode
    (root / "deep.json").write_text("[" * 10000 + "]" * 10000)
    (root / "deep.toml").write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    (root / "list.json").write_text("[1, 2]")
    geometry = dict(
        num_attention_heads=2, attention_head_dim=128, in_channels=4, out_channels=4, text_dim=16,
        freq_dim=32, ffn_dim=64, num_layers=2,
    )  # fmt: skip
    (root / "huge.json").write_text(json.dumps({**geometry, "num_layers": 1_000_000}))
    (root / "negative.json").write_text(json.dumps({**geometry, "num_layers": -3}))
    (root / "heads.json").write_text(json.dumps({**geometry, "num_attention_heads": 3}))
    torch.manual_seed(0)
    torch.save({"generator": CausalWanTransformer(**geometry).state_dict()}, root / "ckpt.pt")
    # a transformer folder whose config asks for 100,000 blocks; a pipeline whose autoencoder holds NaN
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(made["model"] / "transformer", root / "huge_transformer")
    config = json.loads((root / "huge_transformer" / "config.json").read_text())
    (root / "huge_transformer" / "config.json").write_text(json.dumps({**config, "num_layers": 100_000}))
    shutil.copytree(made["model"], root / "nan_vae")
    (weights,) = (root / "nan_vae" / "vae").glob("*.safetensors")
    tensors = load_file(str(weights))
    first = sorted(k for k, v in tensors.items() if v.is_floating_point())[0]
    tensors[first] = tensors[first].clone().fill_(float("nan"))
    save_file(tensors, str(weights))
    made.update(huge_transformer=root / "huge_transformer", nan_vae=root / "nan_vae")
    (root / "report.json").write_text(json.dumps({"per_video": {"std": [1]}}))
    (root / "a_file").write_text("not a folder")
    for name in ("deep.json", "deep.toml", "list.json", "huge.json", "negative.json", "heads.json"):
        made[name] = root / name
    made.update(ckpt=root / "ckpt.pt", report=root / "report.json", a_file=root / "a_file")
    return made


PROMPT = "a red circle moving left on a black background"

# (command line with {placeholders}, the words the one line must hold)
CASES = [
    (
        "render {prompt} --model {model} --set model.vae=wan",
        "holds an AutoencoderKLLite: set model.vae = 'lite'",
    ),
    ("render {prompt} --model {model} --set runtime.attention_backend=flash", "'flash' cannot run here"),
    (
        "render {prompt} --model {model} --set runtime.attention_backend=xformers",
        "'xformers' cannot run here",
    ),
    ("render {prompt} --set model.path=/etc", "model_index.json not found"),
    ("render {prompt} --set model.path=/etc/passwd", "is not a folder"),
    ("render {prompt} --model {model} --set model.path=/etc", "disagree: give one of them"),
    ("render {prompt} --model {model} --image {bomb_png}", "not an image file"),
    ("render {prompt} --model {model} --image {big_png}", "more than the 50,000,000"),
    ("render {prompt} --upscale 16 --height 1024 --width 1024", "H.264 players decode"),  # the default model
    ("render {prompt} --model {model} --out {out}/" + "a" * 240 + ".mp4", "this filesystem allows"),
    ("render {prompt} --model {model} --out {out}/" + "a" * 300 + ".mp4", "this filesystem allows"),
    ("render \u200b\u200c\u2060 --model {model}", "the prompt is empty"),
    ("render --storyboard {deep_toml} --model {model}", "nested too deeply"),
    ("render --storyboard {deep_json} --model {model}", "nested deeper than 16 levels"),
    ("render {prompt} --model {model} --fps 100000", "between 1 frame and"),
    ("render {prompt} --model {model} --steps 100000", "at most 1000"),
    ("render {prompt} --model {model} --lora {ckpt}:nan", "finite"),
    (
        "render {prompt} --model {model} --transformer {huge_transformer}",
        "num_layers is 100000 but the weights have 2",
    ),
    ("render {prompt} --model {nan_vae}", "the autoencoder at"),
    ("eval --prompts /dev/zero --out-dir {out}", "is a device, not a file"),
    ("eval --prompts {deep_json} --out-dir {out}", "deep.json:1: empty prompt"),
    ("eval --compare {deep_json} {deep_json}", "nested deeper than 16 levels"),
    ("eval --compare /dev/zero /dev/zero", "is a device, not a file"),
    ("eval --compare {report} {report}", "not as vidgen eval writes them"),
    ("convert {ckpt} {out}/c --config {huge_json}", "num_layers is 1000000 but the weights have 2"),
    ("convert {ckpt} {out}/c --config {negative_json}", "num_layers must be a positive integer, got -3"),
    ("convert {ckpt} {out}/c --config {heads_json}", "num_attention_heads x attention_head_dim is 384"),
    ("convert {ckpt} {out}/c --config {list_json}", "must hold a JSON object of settings, not a list"),
    ("convert {ckpt} {out}/c --config /dev/zero", "is a device, not a file"),
    ("convert {ckpt} {out}/c --config {deep_json}", "nested deeper than 16 levels"),
    ("convert {ckpt} {a_file}", "is a file, not a folder"),
    ("convert {ckpt} {out}/c --lora {ckpt}:nan", "finite"),
]


def command_line(line: str, files: dict[str, Path], out: Path) -> list[str]:
    """A case's arguments with its files filled in (``out``: the folder nothing may be written to)."""
    values = {**{k: str(v) for k, v in files.items()}, "out": str(out), "prompt": shlex.quote(PROMPT)}
    argv = shlex.split(line.format(**{k.replace(".", "_"): v for k, v in values.items()}))
    if argv[0] == "render" and "--out" not in argv:
        argv += ["--out", str(out / "video.mp4")]
    return argv


@pytest.mark.parametrize("line, words", CASES, ids=[c[0].split("--", 1)[-1][:60] for c in CASES])
def test_one_line_exit_2_nothing_written(files, tmp_path, capsys, line, words):
    out = tmp_path / "out"
    out.mkdir()
    argv = command_line(line, files, out)
    started = time.perf_counter()
    code = main(argv)
    elapsed = time.perf_counter() - started
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith(f"vidgen {argv[0]}: error: "), err
    assert words in err[0], err[0]
    assert list(out.iterdir()) == [], "a refused command writes nothing"
    assert elapsed < 30, f"{elapsed:.1f} s"  # loading the tiny model included; no hang, no allocation
