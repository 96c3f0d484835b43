"""``vidgen info``: versions, devices, attention backends (and why some are unusable), presets."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import shutil
from importlib import resources
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    parser = sub.add_parser(name, help="print versions, devices, attention backends and the default model")
    parser.set_defaults(run=run)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def run(args: argparse.Namespace) -> int:
    import torch

    import vidgen
    from vidgen.attention import backend_status
    from vidgen.config import preset_names

    print(f"vidgen {vidgen.__version__}  (python {platform.python_version()}, {platform.machine()})")
    packages = ["torch", "diffusers", "transformers", "av", "gradio", "ray", "flash-attn", "xformers"]
    print("packages: " + ", ".join(f"{p} {_version(p)}" for p in packages))

    print("devices:")
    print(f"  cpu: {torch.get_num_threads()} torch threads")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            print(f"  cuda:{i}: {props.name}, {props.total_memory / 2**30:.0f} GiB")
    else:
        print("  cuda: none (torch sees no CUDA device)")

    print("attention backends:")
    for status in backend_status():
        mark = "usable" if status.usable else f"unusable: {status.reason}"
        print(f"  {status.name:9s} {mark}")

    for tool in ("ffmpeg", "ffprobe"):
        print(f"{tool}: {shutil.which(tool) or 'not on PATH (needed by the Gradio streaming player)'}")

    # the folder, not vidgen.pipelines.loading.default_model_dir: that imports the whole pipeline stack
    folder = Path(str(resources.files("vidgen.default_model")))
    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix in (".safetensors", ".json")]
    if (folder / "model_index.json").is_file():
        size = sum(p.stat().st_size for p in files) / 2**20
        print(f"default model: {folder} ({size:.1f} MB)")
    else:
        print(f"default model: missing from {folder}")
    print("presets: " + ", ".join(preset_names()))
    return 0
