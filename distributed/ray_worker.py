"""The Ray worker: one process holding one pipeline (one rank of a replica), streaming chunks back.

A replica is ``sp`` workers. With ``sp == 1`` a worker runs ``pipe.stream`` itself; with ``sp > 1``
every rank joins a torch.distributed group (gloo over a ``file://`` rendezvous on CPU, nccl on GPU)
and calls ``sequence_parallel_stream``, and rank 0 yields the chunks. :meth:`PipelineWorker.stream`
is a Ray streaming generator: the driver receives each chunk as soon as it is decoded, and
back-pressure keeps a worker at most a couple of chunks ahead of the driver.

Resumable state: the pipeline saves its state after every chunk to one working file per rank;
each worker hard-links every version of it to ``state.NNNNN.rankR.safetensors`` (the state after
chunk NNNNN). The driver resumes from the newest snapshot at or before the last chunk it *recorded*,
however far ahead the worker ran before it died (see ``vidgen.distributed.render``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vidgen.request import GenerationRequest

WORK_DIR = "ray"
"""Sub-folder of a render's ``.parts`` folder holding the workers' state snapshots."""


def sequence_parallel_stream():
    """``sequence_parallel_stream(pipe, group, **stream_kwargs)``, imported when a worker needs it."""
    from vidgen.distributed.parallel_stream import sequence_parallel_stream as stream

    return stream


def sequence_parallel_module():
    """``vidgen.distributed.sequence_parallel``, imported when a worker needs it."""
    from vidgen.distributed import sequence_parallel

    return sequence_parallel


@dataclass
class PipelineSpec:
    """What every worker loads: ``LongVideoPipeline.from_pretrained(model, config=config, **overrides)``."""

    model: str | None = None
    """Local pipeline folder or preset name; None: the embedded default model."""
    config: str | None = None
    """Preset name or TOML file replacing the folder's config."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """``"table.key": value`` overrides applied at load time."""

    def load(self):
        from vidgen.pipelines import LongVideoPipeline

        return LongVideoPipeline.from_pretrained(self.model, config=self.config, **self.overrides)


def snapshot_path(work_dir: str | os.PathLike, chunk_index: int, rank: int | str = 0) -> Path:
    """Rank ``rank``'s pipeline state saved after chunk ``chunk_index`` (``rank="decoder"``: the
    decode worker's streaming-decoder state)."""
    who = rank if isinstance(rank, str) else f"rank{rank}"
    return Path(work_dir) / f"state.{chunk_index:05d}.{who}.safetensors"


def snapshots(work_dir: str | os.PathLike, ranks: int, decoder: bool = False) -> dict[int, list[Path]]:
    """Chunk index -> the snapshot of every rank (then the decoder's, with ``decoder``), for the
    chunks that all of them have one of."""
    found: dict[int, list[Path]] = {}
    for index in sorted(
        {int(p.name.split(".")[1]) for p in Path(work_dir).glob("state.*.rank0.safetensors")}
    ):
        paths = [snapshot_path(work_dir, index, rank) for rank in range(ranks)]
        if decoder:
            paths.append(snapshot_path(work_dir, index, "decoder"))
        if all(path.is_file() for path in paths):
            found[index] = paths
    return found


def saved_chunk_index(path: str | os.PathLike) -> int | None:
    """Index of the last chunk a pipeline state file was saved after (None: no readable file)."""
    from safetensors import safe_open

    try:
        with safe_open(os.fspath(path), framework="pt") as f:
            return int(f.get_tensor("extra.chunk_index")[0])
    except (OSError, KeyError, ValueError, RuntimeError):
        return None


def link_atomically(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Make ``target`` name the file ``source`` names now (a hard link; a copy where links fail)."""
    target = Path(target)
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temp.unlink(missing_ok=True)
    try:
        os.link(source, temp)
    except OSError:
        shutil.copyfile(source, temp)
    os.replace(temp, target)


class PipelineWorker:
    """One rank of one replica. Wrapped with ``ray.remote`` by :func:`worker_class`."""

    def __init__(
        self, spec: PipelineSpec, rank: int = 0, world_size: int = 1, init_method: str | None = None
    ) -> None:
        import torch

        self.rank, self.world_size = rank, world_size
        if os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        self.group = None
        # An error here is kept and raised by ready(): raised from __init__, Ray would report a
        # dead actor and lose the exception's type (a ModelLoadError must reach the user as one).
        self._init_error: Exception | None = None
        try:
            self.pipe = spec.load()
            if world_size > 1:
                sp = sequence_parallel_module()
                heads = self.pipe.transformer.config.num_attention_heads
                kind = sp.resolve_kind(self.pipe.config.runtime.sp_kind, heads, world_size)
                try:
                    sp.validate_degrees(self.pipe.transformer.config, world_size, 1, world_size, kind=kind)
                except ValueError as err:  # the user's to fix: the CLI prints it as one line
                    from vidgen.distributed.ray_cluster import DegreeError

                    raise DegreeError(str(err)) from None
                self.group = sp.init_process_group(rank, world_size, init_method, sp=world_size, kind=kind)
        except Exception as err:
            self._init_error = err

    def ready(self) -> dict[str, Any]:
        """Process facts the driver needs (and tests use: the pid to kill)."""
        import ray

        if self._init_error is not None:
            raise self._init_error
        g = self.pipe.config.generation
        return {
            "pid": os.getpid(),
            "node": ray.util.get_node_ip_address(),
            "rank": self.rank,
            "fps": g.fps,
            "height": g.height,
            "width": g.width,
        }

    def stream(
        self,
        request: GenerationRequest,
        work_dir: str,
        start_states: list[str] | None = None,
        skip_through: int = -1,
        decode: bool = True,
    ) -> Iterator[Any]:
        """Yield the :class:`VideoChunk` s of ``request`` (its seed set) after chunk ``skip_through``.

        ``start_states``: one saved state per rank to resume from (the chunks they hold are not
        made again). Chunks between a state and ``skip_through`` (all of them, without a state) are
        made again to rebuild the cache but not yielded: chunk noise depends only on (seed, index),
        so what follows is the same. Ranks other than 0 yield nothing and end with the video.
        ``decode=False``: chunks carry latents, not frames, for a :class:`DecodeWorker`.
        """
        if self._init_error is not None:
            raise self._init_error
        work = Path(work_dir)
        work.mkdir(parents=True, exist_ok=True)
        state = work / f"working.rank{self.rank}.safetensors"
        resume = start_states is not None
        if resume:
            link_atomically(start_states[self.rank], state)
        else:
            state.unlink(missing_ok=True)
        kwargs = {**request.stream_kwargs(), "state_path": state, "resume": resume, "decode": decode}
        overrides = request.config_overrides()
        config = self.pipe.config.replace(**overrides) if overrides else self.pipe.config
        chunk_frames = config.generation.chunk_frames
        if self.group is None:
            chunks = self.pipe.stream(**kwargs)
        else:
            chunks = sequence_parallel_stream()(self.pipe, self.group, **kwargs)
        for chunk in chunks:
            self._snapshot(state, work)
            if self.rank == 0 and chunk.index > skip_through:
                if decode:
                    chunk.latents = None  # the driver needs frames only
                    yield chunk
                else:
                    chunk.latents = chunk.latents.cpu()
                    yield chunk, chunk.index * chunk_frames  # and where its latents start
        self._snapshot(state, work)

    def _snapshot(self, state: Path, work: Path) -> None:
        """Keep the state the pipeline last saved under the index of its chunk (the pipeline
        overwrites its file after every chunk; a hard link keeps each version for free)."""
        index = saved_chunk_index(state) if state.is_file() else None
        if index is not None and not snapshot_path(work, index, self.rank).is_file():
            link_atomically(state, snapshot_path(work, index, self.rank))

    def traffic(self) -> int:
        """Bytes this rank has sent to the others of its group (0 without sequence parallelism)."""
        return int(getattr(self.group, "bytes_sent", 0)) if self.group is not None else 0

    def close(self) -> None:
        if self.group is not None and hasattr(self.group, "destroy"):
            self.group.destroy()


class DecodeWorker:
    """The VAE alone, decoding a replica's chunks (in order) while its ranks denoise the next ones.

    Its streaming-decoder state after chunk ``i`` is kept as ``state.{i}.decoder.safetensors`` next
    to the ranks' snapshots, so a replica resumed from chunk ``i`` decodes on seamlessly.
    """

    def __init__(self, spec: PipelineSpec) -> None:
        import torch

        if os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        self._init_error: Exception | None = None
        try:
            from vidgen.pipelines import loading

            folder, config = loading.resolve_model(spec.model, _config_of(spec))
            if spec.overrides:
                config = config.replace(**spec.overrides)
            self.vae = loading.load_vae(folder, config)
            device = config.runtime.device
            if device == "auto":
                device = "cuda" if torch.cuda.is_available() else "cpu"
            self.vae.to(device)
        except Exception as err:
            self._init_error = err
        self.decoder = None
        self.work: Path | None = None

    def ready(self) -> dict[str, Any]:
        if self._init_error is not None:
            raise self._init_error
        return {"pid": os.getpid(), "role": "decoder"}

    def start(self, work_dir: str, start_state: str | None) -> None:
        """A new stream: from the decoder state saved after a chunk, or from the first chunk."""
        from vidgen.pipelines.vae_stream import streaming_decoder

        self.work = Path(work_dir)
        self.decoder = streaming_decoder(self.vae)
        self.decoder.reset()
        if start_state is not None:
            from safetensors.torch import load_file

            tensors = load_file(start_state, device=str(next(self.vae.parameters()).device))
            self.decoder.load_state({k: v for k, v in tensors.items() if not k.startswith("extra.")})

    def decode(self, latents, latent_start: int, chunk_index: int, keep: int | None) -> tuple[Any, float]:
        """``(frames, seconds)``: the chunk's first ``keep`` frames (all: None) and the decode time."""
        import time

        import torch
        from safetensors.torch import save_file

        from vidgen.pipelines.pipeline import decode_to_frames

        started = time.perf_counter()
        device = next(self.vae.parameters()).device
        with torch.no_grad():
            frames = decode_to_frames(self.decoder, latents.to(device), latent_start)
        state = {k: v.detach().cpu().contiguous() for k, v in self.decoder.state().items()}
        state["extra.chunk_index"] = torch.tensor([chunk_index])
        target = snapshot_path(self.work, chunk_index, "decoder")
        temp = target.with_name(target.name + ".tmp")
        save_file(state, os.fspath(temp))
        os.replace(temp, target)
        return (frames if keep is None else frames[:keep]), time.perf_counter() - started


def _config_of(spec: PipelineSpec):
    from vidgen.config import load_config

    return load_config(spec.config) if spec.config else None


def worker_class(gpu: bool, env: dict[str, str] | None = None, cls: type = PipelineWorker):
    """``PipelineWorker`` (or ``cls``) as a Ray actor class. Workers die with the driver (no
    restarts: the driver replaces a dead worker itself, so a replica's ranks always form a fresh
    group)."""
    import ray

    options: dict[str, Any] = {"max_restarts": 0, "max_task_retries": 0}
    if env:
        options["runtime_env"] = {"env_vars": env}
    return ray.remote(**options)(cls)


def worker_env(loopback: bool) -> dict[str, str]:
    """Environment for worker processes: one torch thread per CPU slot unless set, and gloo's
    sockets on the loopback interface when the cluster is the private local one."""
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if loopback:
        env["GLOO_SOCKET_IFNAME"] = "lo"
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VIDGEN_FLEX_COMPILE"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env
