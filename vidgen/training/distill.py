"""Few-step distillation of the causal transformer: ODE regression, then Self Forcing with DMD.

Both stages train a *student* (initialised from the many-step *teacher*) to make each chunk in the
pipeline's few steps (``student_steps``, the pipeline's ``FlowSchedule`` sigmas and sampler),
chunk by chunk against the KV cache, as ``LongVideoPipeline`` runs it in ``chunkwise`` mode:
text pair ``[prompt ‖ prompt]`` (or the prompt alone), rolling rope positions, sinks + window,
the finished chunk written back to the cache at ``addnoise_condition``.

``ode`` (CausVid's initialisation): the frozen teacher makes ODE trajectories chunk by chunk
(``teacher_steps`` Euler steps of the same shifted schedule, optional CFG), recording the latents at
the student's sigmas; a pool of them is made once and kept in the run folder. The student sees a
trajectory point of every chunk, at a random student sigma, against a cache holding the teacher's
finished chunks, and regresses the teacher's final chunk: ``|x - sigma * v - x0_teacher|^2`` for
the ``x0_renoise`` sampler (as CausVid); for the deterministic ``euler`` sampler, the clean estimate
whose Euler step lands on the trajectory's point at the next student sigma, so that the student's
few steps follow the teacher's path (the last step's target is the teacher's chunk either way).

``self-forcing`` (Self Forcing, DMD2 loss): the student makes a whole rollout itself, through its
own cache, with no gradient except at one *exit* step per chunk (random, as Self Forcing picks it;
the chunk's output is the clean estimate there and goes to the cache without gradient). Noised
rollouts are scored by the frozen teacher with CFG (*real* score) and by a trainable *fake* score
(initialised from the teacher, trained with the flow-matching loss on the student's detached
rollouts); the generator's gradient is the normalised difference of their clean estimates.
Every step trains the fake score; every ``generator_every``-th step also the generator. With
``regression_weight`` the generator update also regresses the teacher's trajectory pool (the ``ode``
stage's loss), DMD's paired regression term: it holds the student near what the teacher draws while
the distribution matching moves it. With ``data_weight`` it also takes the flow-matching loss on
Shapes World clips rendered on the fly (captioned, encoded by the teacher's autoencoder): that holds
it to the data instead. With ``motion_weight`` / ``motion_speed_weight`` the rollout is decoded with
its gradient and the object's soft centroid is held to Shapes World's physics away from the walls:
constant velocity, the caption's speed (:mod:`vidgen.training.motion`); with ``frame_weight`` each
decoded frame is pulled toward the caption's object drawn where the student put it
(:mod:`vidgen.training.ideal`). Otherwise no data is
needed: prompts come from Shapes World's captions or from a text file.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from vidgen.config import VidgenConfig
from vidgen.models import CausalWanTransformer
from vidgen.pipelines import loading
from vidgen.pipelines.scheduler import FlowSchedule, add_noise
from vidgen.pipelines.vae_stream import video_to_uint8
from vidgen.shapes import captions, world
from vidgen.shapes.correction import continuation
from vidgen.shapes.prompts import PromptSpec, parse_prompt
from vidgen.shapes.world import Clip
from vidgen.training import ideal, motion
from vidgen.training.checkpoint import as_float, load_transformer
from vidgen.training.configs import DistillTrainConfig
from vidgen.training.data import clips_to_tensor
from vidgen.training.loop import TrainingRun
from vidgen.training.rollout import (
    Rollout,
    conditioning,
    dmd_loss,
    flow_matching_loss,
    reading_view,
    sample_sigmas,
    score_pattern,
    text_embeddings,
    velocity,
)
from vidgen.training.transformer import latent_object_weight, latent_stats


class DistillSetupError(ValueError):
    """A teacher, prompt file or setting that cannot be distilled as asked; the message says what
    to change (the CLI prints it as one line)."""


# ----------------------------------------------------------------------------- teacher and prompts


@dataclass
class Teacher:
    transformer: CausalWanTransformer
    text_encoder: nn.Module
    config: VidgenConfig
    """The pipeline config the teacher runs with (the student runs with it too)."""
    folder: Path
    """Pipeline folder of the other components (text encoder, autoencoder)."""
    latent_hw: tuple[int, int]


def load_teacher(path: str | Path, base: str | Path = "") -> Teacher:
    """A pipeline folder, or a transformer training run (its EMA weights) whose other components and
    settings come from ``base`` (default: the embedded default model), as ``vidgen train export``
    would assemble them."""
    path = Path(path).expanduser()
    run_state = path / "latest" / "state.json"
    if (path / "model_index.json").is_file():
        folder, config = loading.resolve_model(path, None)
        transformer = loading.load_transformer(folder, config.replace(**{"runtime.dtype": "float32"}))
    elif run_state.is_file():
        folder, config = loading.resolve_model(str(base) if base else None, None)
        train = json.loads(run_state.read_text())["config"]
        config = config.replace(
            **{
                f"generation.{k}": train[k]
                for k in ("chunk_frames", "sink_frames", "window_frames")
                if k in train
            }
        )
        transformer = CausalWanTransformer.from_config(CausalWanTransformer.load_config(path / "latest"))
        transformer.load_state_dict(as_float(load_file(str(path / "latest" / "ema.safetensors"))))
    else:
        raise FileNotFoundError(
            f"{path}: the teacher must be a pipeline folder (model_index.json) or a training run (latest/)"
        )
    vae_config = json.loads((folder / "vae" / "config.json").read_text())
    spatial = int(vae_config.get("scale_factor_spatial") or 8)
    g = config.generation
    return Teacher(
        transformer=transformer.float().eval().requires_grad_(False),
        text_encoder=loading.load_text_encoder(folder, config),
        config=config,
        folder=folder,
        latent_hw=(g.height // spatial, g.width // spatial),
    )


class PromptSource:
    """Training prompts: lines of a text file, or Shapes World captions (paraphrased)."""

    def __init__(self, path: str = "") -> None:
        self.lines: list[str] = []
        if path:
            self.lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
            if not self.lines:
                raise DistillSetupError(f"{path} holds no prompts (one per line)")

    def sample(self, rng: np.random.Generator, count: int) -> list[str]:
        if self.lines:
            return [self.lines[int(i)] for i in rng.integers(0, len(self.lines), size=count)]
        return [captions.caption(world.sample_scene(rng), rng, paraphrase=True) for _ in range(count)]


# ----------------------------------------------------------------------------- trainer


class DistillModules(nn.Module):
    """What a distillation run trains (and checkpoints): the generator, and the fake score in the
    self-forcing stage."""

    def __init__(self, generator: CausalWanTransformer, fake_score: CausalWanTransformer | None) -> None:
        super().__init__()
        self.generator = generator
        self.fake_score = fake_score

    def save_config(self, folder: str | Path) -> None:
        self.generator.save_config(folder)


class Distiller:
    """One distillation run: the teacher, the student (and fake score), their rollouts and losses."""

    def __init__(self, config: DistillTrainConfig, teacher: Teacher | None = None) -> None:
        if not config.teacher and teacher is None:
            raise DistillSetupError("--teacher is required: a pipeline folder or a transformer training run")
        self.config = config
        self.device = torch.device(config.device)
        self.autocast = torch.bfloat16 if config.dtype == "bfloat16" else None
        self.teacher = teacher or load_teacher(config.teacher, config.base)
        self.shift = config.shift or self.teacher.config.generation.shift
        # what the student runs, as the exported pipeline will run it
        self.pipe_config = self.teacher.config.replace(
            **{
                "generation.num_inference_steps": config.student_steps,
                "generation.sampler": config.sampler,
                "generation.shift": self.shift,
                "generation.guidance_scale": 1.0,
            }
        )
        if self.teacher.config.generation.mode != "chunkwise":
            raise DistillSetupError(
                "distillation follows the pipeline's chunkwise mode; the teacher's config says otherwise"
            )
        self.latent_hw = self.teacher.latent_hw
        self.real = self.teacher.transformer.to(self.device)
        student = load_transformer(config.init_from) if config.init_from else copy.deepcopy(self.real)
        student.requires_grad_(True).train()
        fake = None
        if config.stage == "self-forcing":
            fake = copy.deepcopy(self.real).requires_grad_(True).train()
        g = self.teacher.config.generation
        if config.gradient_checkpointing:
            if (config.rollout_chunks - 1) * g.chunk_frames > g.sink_frames + g.window_frames:
                raise DistillSetupError(
                    f"gradient_checkpointing recomputes chunks against the cache: rollout_chunks="
                    f"{config.rollout_chunks} would overwrite cached frames (at most "
                    f"{1 + (g.sink_frames + g.window_frames) // g.chunk_frames} chunks with this cache)"
                )
            for model in (student, fake):
                if model is not None:
                    model.enable_gradient_checkpointing()
        self.modules = DistillModules(student, fake).to(self.device)
        self.student_schedule = FlowSchedule(config.student_steps, self.shift, config.sampler)
        self.rollout = Rollout(
            self.pipe_config, self.latent_hw, self.student_schedule, autocast=self.autocast
        )
        self.prompts = PromptSource(config.prompts)
        self.teacher.text_encoder.to(self.device)  # UMT5 on a GPU: prompts change every step
        self.chunk_shape = (self.real.config.in_channels, g.chunk_frames, *self.latent_hw)
        self.pattern = score_pattern(self.real, self.teacher.config, self.latent_hw, config.teacher_attention)
        self.vae = None
        # the correction term's rollouts have a cache of their own: the generator's rollout keeps
        # its graph into the main one until the update's backward
        self.correction_rollout = Rollout(
            self.pipe_config, self.latent_hw, self.student_schedule, autocast=self.autocast
        )
        # and the decoded terms' later rollout (decoded_prefix_chunks) likewise
        self.later_rollouts = Rollout(
            self.pipe_config, self.latent_hw, self.student_schedule, autocast=self.autocast
        )
        terms = (
            "data_weight",
            "correction_weight",
            "motion_weight",
            "motion_speed_weight",
            "motion_still_weight",
            "motion_wall_weight",
            "frame_weight",
        )
        used = [name for name in terms if getattr(config, name) > 0]
        if used:
            term = used[0]
            if config.prompts:
                raise DistillSetupError(
                    f"{term} works on Shapes World clips and captions: leave out --prompts"
                )
            if g.height != g.width:
                raise DistillSetupError(f"{term} renders square Shapes World clips, not {g.height}x{g.width}")
            self.vae = loading.load_vae(self.teacher.folder, self.pipe_config)
            self.vae = self.vae.to(self.device).float().eval().requires_grad_(False)
            self.latent_mean, self.latent_std = (t.to(self.device) for t in latent_stats(self.vae))
            self.temporal = int(getattr(self.vae.config, "scale_factor_temporal", 4) or 4)
            for name in ("decoded_prefix_chunks", "dmd_prefix_chunks"):
                if getattr(config, name) and not hasattr(self.vae, "decode_unclamped"):
                    raise DistillSetupError(
                        f"{name} decodes from a later latent frame, which "
                        f"{type(self.vae).__name__} does not; use 0"
                    )

    @property
    def student(self) -> CausalWanTransformer:
        return self.modules.generator

    def embed(self, prompts: list[str]) -> torch.Tensor:
        with torch.no_grad():
            return text_embeddings(self.teacher.text_encoder, prompts, self.teacher.config, self.device)

    def noises(self, batch: int, generator: torch.Generator, count: int | None = None) -> list[torch.Tensor]:
        """``count`` chunks' starting noise (default ``rollout_chunks``), drawn from ``generator``."""
        count = self.config.rollout_chunks if count is None else count
        return [
            torch.randn((batch, *self.chunk_shape), generator=generator).to(self.device) for _ in range(count)
        ]

    # ---------------------------------------------------------------- ode stage
    def trajectory_indices(self) -> list[int]:
        """Teacher steps whose input is at the student's sigmas (the teacher's grid contains them)."""
        every = self.config.teacher_steps // self.config.student_steps
        return [k * every for k in range(self.config.student_steps)]

    @torch.no_grad()
    def teacher_trajectories(self, prompts: list[str], generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The teacher's many-step generation of ``prompts``: its latents at the student's sigmas
        (B, K, C, F, h, w) and its clean video (B, C, F, h, w). A causal teacher makes it chunk by
        chunk through its cache; a bidirectional one (``teacher_attention="full"``, as CausVid's
        Wan teacher) the whole video at once."""
        c = self.config
        schedule = FlowSchedule(c.teacher_steps, self.shift, "euler")
        text = self.embed(prompts)
        uncond = self.embed([self.teacher.config.generation.negative_prompt] * len(prompts))
        noises = self.noises(len(prompts), generator)
        record = self.trajectory_indices()
        if c.teacher_attention == "full":
            x, levels = torch.cat(noises, dim=2), []
            for index, sigma in enumerate(schedule.sigmas[:-1]):
                if index in record:
                    levels.append(x)
                level = torch.full((x.shape[0], x.shape[2]), sigma, device=x.device)
                v = velocity(
                    self.real,
                    x,
                    level,
                    text,
                    None,
                    uncond=uncond,
                    guidance_scale=c.teacher_guidance,
                    autocast=self.autocast,
                )
                x = schedule.step(x, v, index)
            return {"levels": self._stored(torch.stack(levels, dim=1)), "clean": self._stored(x)}
        rollout = Rollout(self.teacher.config, self.latent_hw, schedule, autocast=self.autocast)
        cond = conditioning(self.real, text, uncond, c.teacher_guidance)
        video, recorded = rollout.run(self.real, cond, noises, record=record)
        levels = torch.cat([torch.stack(chunk, dim=1) for chunk in recorded], dim=3)  # (B, K, C, F, h, w)
        return {"levels": self._stored(levels), "clean": self._stored(video)}

    def _stored(self, latents: torch.Tensor) -> torch.Tensor:
        """Pool tensors live on the CPU, in bf16 when training in bf16 (a Wan-size pool is large)."""
        return latents.to("cpu", torch.bfloat16 if self.autocast is not None else torch.float32)

    def ode_pool(self) -> tuple[dict[str, torch.Tensor], list[str]]:
        """The run's trajectory pool, made once (``ode_pairs`` trajectories) and kept in the run folder."""
        c = self.config
        path = Path(c.run_dir) / "ode_pairs.safetensors"
        if path.is_file():
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                prompts = json.loads(f.metadata()["prompts"])
            return load_file(str(path)), prompts
        rng = np.random.default_rng([c.seed, 7])
        generator = torch.Generator().manual_seed(c.seed * 1_000_003 + 7)
        parts, prompts = [], []
        for start in range(0, c.ode_pairs, c.batch_size):
            batch = self.prompts.sample(rng, min(c.batch_size, c.ode_pairs - start))
            parts.append(self.teacher_trajectories(batch, generator))
            prompts += batch
        pool = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(pool, str(path), metadata={"prompts": json.dumps(prompts)})
        return pool, prompts

    def regression_loss(
        self,
        prompts: list[str],
        levels: torch.Tensor,
        clean: torch.Tensor,
        steps: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """ODE regression: each chunk at the student sigma ``steps[i]`` of its trajectory, against a
        cache of the teacher's finished chunks, regresses the teacher's chunk (``x0_renoise``, as
        CausVid) or, for the deterministic ``euler`` sampler, the clean estimate whose step reaches
        the trajectory's point at the next student sigma."""
        sigmas = self.student_schedule.sigmas
        model = self.student
        denoiser = self.rollout.denoiser(model)
        cond = conditioning(model, self.embed(prompts))
        batch = len(prompts)
        cache = self.rollout.cache(model, batch)
        f = self.rollout.chunk_frames
        losses = []
        for i, k in enumerate(steps.tolist()):
            frames = slice(i * f, (i + 1) * f)
            x = levels[:, k, :, frames].to(self.device, torch.float32)
            finished = clean[:, :, frames].to(self.device, torch.float32)
            target = finished
            if self.config.sampler == "euler" and k + 1 < len(levels[0]):
                # a deterministic sampler follows the trajectory: the estimate whose Euler step
                # lands on the teacher's next point (the last step's is the teacher's chunk)
                following = levels[:, k + 1, :, frames].to(self.device, torch.float32)
                target = x - sigmas[k] * (following - x) / (sigmas[k + 1] - sigmas[k])
            level = torch.full((batch, f), sigmas[k], device=self.device)
            estimate = x - sigmas[k] * denoiser.predict(x, level, cond, reading_view(cache), i * f)
            losses.append((estimate - target).square().mean())
            if i + 1 < len(steps):
                denoiser.write_context(finished, cond, cache, i * f, generator)
        return torch.stack(losses).mean()

    def pool_regression(self, step: int, pool: dict[str, torch.Tensor], prompts: list[str]) -> torch.Tensor:
        """The ODE regression on a batch of the pool picked by ``step``, each chunk at a random
        student sigma."""
        c = self.config
        rng = np.random.default_rng([c.seed, step])
        pick = rng.choice(len(prompts), size=min(c.batch_size, len(prompts)), replace=False)
        chosen = torch.from_numpy(pick)
        steps = torch.from_numpy(rng.integers(0, c.student_steps, size=c.rollout_chunks))
        context_noise = torch.Generator(self.device).manual_seed(c.seed * 7_919 + step)
        return self.regression_loss(
            [prompts[int(i)] for i in pick],
            pool["levels"][chosen],
            pool["clean"][chosen],
            steps,
            context_noise,
        )

    def ode_step(
        self, step: int, pool: dict[str, torch.Tensor], prompts: list[str]
    ) -> dict[str, torch.Tensor]:
        return {"loss": self.pool_regression(step, pool, prompts)}

    # ---------------------------------------------------------------- data term
    def data_clips(self, step: int) -> tuple[list[Clip], list[str]]:
        """``batch_size`` Shapes World clips as long as a rollout, each from the start of its scene
        (as the pipeline starts a video), and their paraphrased captions."""
        c = self.config
        rng = np.random.default_rng([c.seed, step, 11])
        frames = 1 + self.temporal * (c.rollout_chunks * self.rollout.chunk_frames - 1)
        scenes = [world.sample_scene(rng) for _ in range(c.batch_size)]
        texts = [captions.caption(scene, rng, paraphrase=True) for scene in scenes]
        size = self.teacher.config.generation.height
        return [world.render_clip(scene, frames, size=size, rng=rng) for scene in scenes], texts

    def data_batch(
        self, step: int
    ) -> tuple[torch.Tensor, list[str], torch.Tensor | None, torch.Tensor | None]:
        """``data_clips(step)`` encoded: latents (B, C, F, h, w) normalised as the transformer sees
        them, the captions, the object weight (B, F, h, w) of ``data_object_weight`` (None at 0),
        and with ``data_shape_swap`` the latents of each clip redrawn with another shape (a clip
        whose caption names no shape keeps its own: there is no shape to tell apart; None at 0)."""
        assert self.vae is not None, "data_weight is 0: no autoencoder loaded"
        c = self.config
        clips, texts = self.data_clips(step)
        frames = [clip.frames for clip in clips]
        if c.data_shape_swap > 0:
            rng = np.random.default_rng([c.seed, step, 13])  # its own stream: the clips stay as drawn
            for clip, text in zip(clips, texts):
                named = parse_prompt(text).shape is not None
                other = str(rng.choice([s for s in world.SHAPES if s != clip.scenes[-1].shape]))
                frames.append(world.redraw(clip, shape=other) if named else clip.frames)
        with torch.no_grad():
            video = clips_to_tensor(frames, self.device)
            latents = self.vae.encode(video).latent_dist.mode().float()
        latents = (latents - self.latent_mean) / self.latent_std
        other_shape = None
        if c.data_shape_swap > 0:
            latents, other_shape = latents.chunk(2)
        weight = None
        if c.data_object_weight > 0:
            masks = torch.from_numpy(np.stack([clip.masks for clip in clips])).float().to(self.device)
            spatial = masks.shape[-1] // latents.shape[-1]
            weight = latent_object_weight(masks, self.temporal, spatial, c.data_object_weight)
        return latents, texts, weight, other_shape

    def data_loss(self, step: int) -> torch.Tensor:
        """The flow-matching loss of the student on ``data_batch(step)``, each chunk at its own
        noise level (as the fake score learns the student's rollouts), weighted on the object."""
        c = self.config
        latents, texts, weight, other_shape = self.data_batch(step)
        generator = torch.Generator().manual_seed(c.seed * 1_000_003 + step + 11)
        sigma = sample_sigmas(
            len(texts), c.rollout_chunks, self.rollout.chunk_frames, c, self.shift, generator
        )
        noise = torch.randn(latents.shape, generator=generator).to(self.device)
        source = None
        if other_shape is not None:
            # drawn after the noise: a run without the swap keeps its random stream
            swapped = torch.rand(len(texts), generator=generator) < c.data_shape_swap
            where = (swapped[:, None] & (sigma >= c.data_shape_swap_sigma)).to(self.device)
            source = torch.where(where[:, None, :, None, None], other_shape, latents)
        return flow_matching_loss(
            self.student,
            latents,
            self.embed(texts),
            sigma.to(self.device),
            noise,
            self.pattern,
            self.autocast,
            weight,
            source,
            c.data_temporal_weight,
        )

    # ---------------------------------------------------------------- correction term
    def decode_frames(self, video: torch.Tensor) -> np.ndarray:
        """Normalised latents (B, C, F, h, w) decoded whole: (B, T, S, S, 3) uint8 frames."""
        assert self.vae is not None, "no autoencoder loaded"
        with torch.no_grad():
            z = video.float() * self.latent_std + self.latent_mean
            pixels = self.vae.decode(z).sample.float()  # (B, 3, T, S, S) in [-1, 1]
        return np.stack([video_to_uint8(one[None]).cpu().numpy() for one in pixels])

    def correction_batch(self, step: int) -> dict:
        """The student's rollout of ``1..correction_chunks`` chunks of Shapes World captions (as the
        pipeline makes them, no gradient; the cache holds all of them after) and the world's
        continuation of each as the next chunk's latents.

        Returns ``texts``, ``context_chunks``, ``conditioning`` (with the text projection's graph),
        ``target`` (B, C, chunk_frames, h, w) normalised, ``valid`` (B,) bool (False where the
        rollout's last frames show no object: nothing to continue), the rollout's latents ``video``
        (B, C, F, h, w) and decoded ``frames`` (B, T, S, S, 3), and the ``continuations``."""
        c = self.config
        rng = np.random.default_rng([c.seed, step, 17])
        context_chunks = int(rng.integers(1, c.correction_chunks + 1))
        scenes = [world.sample_scene(rng) for _ in range(c.batch_size)]
        texts = [captions.caption(scene, rng, paraphrase=True) for scene in scenes]
        generator = torch.Generator().manual_seed(c.seed * 1_000_003 + step + 17)
        noises = [
            torch.randn((c.batch_size, *self.chunk_shape), generator=generator).to(self.device)
            for _ in range(context_chunks)
        ]
        cond = conditioning(self.student, self.embed(texts))
        with torch.no_grad():
            video, _ = self.correction_rollout.run(self.student, cond, noises, write_last=True)
        frames = self.decode_frames(video)
        chunk_video_frames = self.temporal * self.correction_rollout.chunk_frames
        continued, videos = [], []
        for shown, text, scene in zip(frames, texts, scenes, strict=True):
            found = continuation(shown, parse_prompt(text), scene, chunk_video_frames)
            continued.append(found)
            # (a rollout with nothing to continue holds its last frame: it leaves the loss)
            following = (
                found.clip.frames if found is not None else np.repeat(shown[-1:], chunk_video_frames, axis=0)
            )
            videos.append(np.concatenate([shown, following]))
        # the rollout's own frames lead in: a causal autoencoder codes a chunk from what came before
        with torch.no_grad():
            latents = self.vae.encode(clips_to_tensor(videos, self.device)).latent_dist.mode().float()
        latents = (latents - self.latent_mean) / self.latent_std
        target = latents[:, :, -self.correction_rollout.chunk_frames :]
        return {
            "texts": texts,
            "context_chunks": context_chunks,
            "conditioning": cond,
            "target": target,
            "valid": torch.tensor([found is not None for found in continued], device=self.device),
            "video": video,
            "frames": frames,
            "continuations": continued,
        }

    def correction_loss(self, step: int) -> torch.Tensor:
        """The student's flow-matching loss on the world's continuation of its own rollout
        (``correction_batch``), the chunk noised to a level drawn as the data term draws them."""
        c = self.config
        batch = self.correction_batch(step)
        target = batch["target"]
        generator = torch.Generator().manual_seed(c.seed * 1_000_003 + step + 19)
        f = self.correction_rollout.chunk_frames
        sigma = sample_sigmas(len(target), 1, f, c, self.shift, generator).to(self.device)  # (B, f)
        noise = torch.randn(target.shape, generator=generator).to(self.device)
        return self.correction_prediction_loss(batch, sigma, noise)

    def correction_prediction_loss(
        self, batch: dict, sigma: torch.Tensor, noise: torch.Tensor
    ) -> torch.Tensor:
        """The velocity regression on ``batch``'s target chunk noised by ``noise`` to ``sigma`` (B, f),
        predicted against the cache its rollout left, as the pipeline would predict the next chunk;
        the mean over the samples with a continuation."""
        target, valid = batch["target"], batch["valid"]
        cache = self.correction_rollout.last_cache
        assert cache is not None, "correction_batch first"
        noisy = add_noise(target, noise, sigma[:, None, :, None, None])
        denoiser = self.correction_rollout.denoiser(self.student)
        offset = batch["context_chunks"] * self.correction_rollout.chunk_frames
        v = denoiser.predict(noisy, sigma, batch["conditioning"], reading_view(cache), offset)
        err = (v - (noise - target)).square().mean(dim=(1, 2, 3, 4))  # (B,)
        return (err * valid).sum() / valid.sum().clamp(min=1)

    # ---------------------------------------------------------------- terms on the decoded rollout
    def decode(
        self, video: torch.Tensor, first_latent: int = 0, previous: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Normalised latents (B, C, F, h, w), latent frames ``first_latent ..`` of a rollout, decoded
        with their gradient to (B, 3, T, S, S) in [-1, 1]; from a later frame the decoder reads
        ``previous``, the latent frame before them, as the streaming decoder does."""
        assert self.vae is not None, "no autoencoder loaded"
        z = video.float() * self.latent_std + self.latent_mean
        if not first_latent:
            return self.vae.decode(z).sample
        assert previous is not None, "decoding from a later latent frame needs the frame before it"
        before = previous.float() * self.latent_std + self.latent_mean
        return self.vae.decode(z, first_latent_index=first_latent, previous=before).sample

    def decoded_losses(
        self,
        video: torch.Tensor,
        texts: list[str],
        first_latent: int = 0,
        previous: torch.Tensor | None = None,
        terms: frozenset[str] | None = None,
    ) -> dict[str, torch.Tensor]:
        """The rollout ``video`` (B, C, F, h, w) normalised, decoded with its gradient and measured
        against its captions: ``motion_loss`` and ``speed_loss`` (:func:`vidgen.training.motion.
        motion_penalties`) with ``motion_weight`` / ``motion_speed_weight``, ``still_loss``
        (:func:`vidgen.training.motion.still_penalty`) with ``motion_still_weight``, ``wall_loss``
        (:func:`vidgen.training.motion.wall_penalty`) with ``motion_wall_weight``, ``frame_loss``
        (:func:`vidgen.training.ideal.frame_penalty`) with ``frame_weight``. A caption the parser
        cannot read leaves the terms. ``video`` starts at latent frame ``first_latent`` of its
        rollout; ``previous`` (normalised) is the latent frame before it. ``terms`` (names of
        ``DistillTrainConfig.decoded_weights``) limits the terms measured (None: every one on)."""
        assert self.vae is not None, "no autoencoder loaded"
        c = self.config
        specs, readable = [], []
        for text in texts:
            try:
                specs.append(parse_prompt(text))
                readable.append(True)
            except ValueError:
                specs.append(PromptSpec(color="red", shape="circle", background="black"))
                readable.append(False)
        pixels = self.decode(video, first_latent, previous)
        track = motion.soft_track(pixels, motion.background_colors(specs, self.device))
        ok = torch.tensor(readable, device=self.device)
        track.present &= ok[:, None]
        out: dict[str, torch.Tensor] = {}
        on = c.decoded_on if terms is None else c.decoded_on & terms
        speeds = [motion.named_axis_speed(spec) for spec in specs]
        axis_speed = torch.tensor([s or (0.0, 0.0) for s in speeds], device=self.device)
        known = torch.tensor([s is not None for s in speeds], device=self.device) & ok
        if "motion" in on or "speed" in on:
            constant, speed = motion.motion_penalties(track, axis_speed, known, c.motion_lag)
            if "motion" in on:
                out["motion_loss"] = constant
            if "speed" in on:
                out["speed_loss"] = speed
        if "wall" in on:
            out["wall_loss"] = motion.wall_penalty(track, axis_speed, known)
        if "still" in on:
            still = torch.tensor([motion.still_axes(spec) for spec in specs], device=self.device)
            out["still_loss"] = motion.still_penalty(track, still)
        if "frame" in on:
            judged = ok[:, None].expand_as(track.present) if c.frame_absent else track.present
            out["frame_loss"] = ideal.frame_penalty(pixels, specs, track, judged)
        return out

    # ---------------------------------------------------------------- self-forcing stage
    def later_noises(self, step: int, prefix: int) -> list[torch.Tensor]:
        """The later rollout's chunk noises at ``step``: ``prefix + rollout_chunks`` of them."""
        c = self.config
        generator = torch.Generator().manual_seed(c.seed * 1_000_033 + step)
        return self.noises(c.batch_size, generator, prefix + c.rollout_chunks)

    def later_rollout(
        self, step: int, cond, exits: list[int], prefix: int
    ) -> tuple[torch.Tensor, int, torch.Tensor | None]:
        """The decoded terms' rollout (``decoded_prefix_chunks``): ``prefix`` chunks made as the
        pipeline makes them, without gradient, then ``rollout_chunks`` chunks with the gradient at
        ``exits``. Returns those chunks (B, C, F, h, w), their first latent frame's index in the
        rollout and the latent frame before it (None when the prefix is empty)."""
        c = self.config
        noises = self.later_noises(step, prefix)
        step_generator = torch.Generator(self.device).manual_seed(c.seed * 104_729 + step)
        last = self.student_schedule.num_steps - 1
        video, _ = self.later_rollouts.run(
            self.student,
            cond,
            noises,
            [last] * prefix + list(exits),
            grad=True,
            grad_from=prefix,
            step_generators=[step_generator] * len(noises),
            write_generators=[step_generator] * len(noises),
        )
        first = prefix * self.later_rollouts.chunk_frames
        before = video[:, :, first - 1 : first].detach() if prefix else None
        return video[:, :, first:], first, before

    def prefix_noises(self, step: int, prefix: int) -> list[torch.Tensor]:
        """The noises of the ``dmd_prefix_chunks`` prefix's ``prefix`` chunks at ``step``."""
        c = self.config
        generator = torch.Generator().manual_seed(c.seed * 1_000_037 + step)
        return self.noises(c.batch_size, generator, prefix)

    def scored_frames(self, rolled: torch.Tensor, first: int) -> tuple[torch.Tensor, int]:
        """What the score models see of a rollout whose judged chunks start at latent frame ``first``:
        the sinks and the window before ``first`` (the cache's view for the first judged chunk, its
        positions contiguous as the rolling scheme gives them), then the judged chunks; the context
        is whole chunks, so that the score pattern's chunks are the rollout's. Returns it and how many
        context frames come before the judged ones."""
        g = self.teacher.config.generation
        sinks = min(g.sink_frames, first)
        start = max(sinks, first - g.window_frames)
        start -= -(sinks + first - start) % self.rollout.chunk_frames
        if start <= sinks:  # nothing between the sinks and the window to leave out
            return rolled, first
        return torch.cat([rolled[:, :, :sinks], rolled[:, :, start:]], dim=2), sinks + first - start

    def score_sigmas(self, batch: int, context: int, generator: torch.Generator) -> torch.Tensor:
        """Per-frame noise levels for the score models: 0 on ``context`` frames, then the judged
        chunks' levels (:func:`sample_sigmas`)."""
        c = self.config
        sigma = sample_sigmas(batch, c.rollout_chunks, self.rollout.chunk_frames, c, self.shift, generator)
        return torch.cat([torch.zeros(batch, context), sigma], dim=1)

    def exit_steps(self, rng: np.random.Generator) -> list[int]:
        c = self.config
        if c.exit_step == "last":
            return [c.student_steps - 1] * c.rollout_chunks
        if c.exit_step == "per_rollout":
            return [int(rng.integers(0, c.student_steps))] * c.rollout_chunks
        return [int(i) for i in rng.integers(0, c.student_steps, size=c.rollout_chunks)]

    def self_forcing_step(
        self, step: int, pool: dict[str, torch.Tensor] | None = None, pool_prompts: list[str] | None = None
    ) -> dict[str, torch.Tensor]:
        """One fake-score update, and every ``generator_every``-th step a generator update: DMD on
        the student's rollout, plus ``regression_weight`` times the ODE regression on ``pool`` and
        ``data_weight`` times the flow-matching loss on rendered clips, and the motion terms
        (``motion_weight``, ``motion_speed_weight``) and the frame term (``frame_weight``) on the
        rollout decoded."""
        c = self.config
        rng = np.random.default_rng([c.seed, step])
        generator = torch.Generator().manual_seed(c.seed * 1_000_003 + step)
        prompts = self.prompts.sample(rng, c.batch_size)
        text = self.embed(prompts)
        uncond = self.embed([self.teacher.config.generation.negative_prompt] * c.batch_size)
        noises = self.noises(c.batch_size, generator)
        exits = self.exit_steps(rng)
        prefix = int(rng.integers(0, c.dmd_prefix_chunks + 1)) if c.dmd_prefix_chunks else 0
        train_generator = step % c.generator_every == 0
        step_generator = torch.Generator(self.device).manual_seed(c.seed * 7_919 + step)
        with torch.set_grad_enabled(train_generator):
            cond = conditioning(self.student, text)
        noises = self.prefix_noises(step, prefix) + noises
        last = self.student_schedule.num_steps - 1
        rolled, _ = self.rollout.run(
            self.student,
            cond,
            noises,
            [last] * prefix + list(exits),
            grad=train_generator,
            grad_from=prefix,
            step_generators=[step_generator] * len(noises),
            write_generators=[step_generator] * len(noises),  # context noise, if any
        )
        chunk_frames = self.rollout.chunk_frames
        first = prefix * chunk_frames
        video = rolled[:, :, first:]  # the judged chunks
        before = rolled[:, :, first - 1 : first].detach() if prefix else None
        scored, context = self.scored_frames(rolled, first)
        batch = video.shape[0]
        out: dict[str, torch.Tensor] = {}
        loss = torch.zeros((), device=self.device)
        if train_generator:
            sigma = self.score_sigmas(batch, context, generator)
            noise = torch.randn(scored.shape, generator=generator).to(self.device)
            out["generator_loss"] = dmd_loss(
                scored,
                self.real,
                self.modules.fake_score,
                text,
                uncond,
                sigma.to(self.device),
                noise,
                self.pattern,
                c.teacher_guidance,
                self.autocast,
                context_frames=context,
            )
            loss = loss + out["generator_loss"]
            if c.regression_weight > 0:
                if pool is None or pool_prompts is None:
                    raise DistillSetupError("regression_weight > 0 needs the trajectory pool (ode_pool())")
                # another seed than the rollout's: the pool's batch is not the rollout's prompts
                out["regression_loss"] = self.pool_regression(step + 1_000_003, pool, pool_prompts)
                loss = loss + c.regression_weight * out["regression_loss"]
            if c.data_weight > 0:
                out["data_loss"] = self.data_loss(step)
                loss = loss + c.data_weight * out["data_loss"]
            if c.correction_weight > 0:
                out["correction_loss"] = self.correction_loss(step)
                loss = loss + c.correction_weight * out["correction_loss"]
            if c.decoded_terms:
                later = c.later_terms
                decoded = {}
                if c.decoded_prefix_chunks:
                    drawn = int(rng.integers(0, c.decoded_prefix_chunks + 1))
                    window, at, previous = self.later_rollout(step, cond, exits, drawn)
                    decoded.update(self.decoded_losses(window, prompts, at, previous, terms=later))
                early = c.decoded_on - later
                if early:
                    decoded.update(self.decoded_losses(video, prompts, first, before, terms=early))
                out.update(decoded)
                for name, weight in (
                    ("motion_loss", c.motion_weight),
                    ("speed_loss", c.motion_speed_weight),
                    ("still_loss", c.motion_still_weight),
                    ("wall_loss", c.motion_wall_weight),
                    ("frame_loss", c.frame_weight),
                ):
                    if name in decoded:
                        loss = loss + weight * decoded[name]
        sigma = self.score_sigmas(batch, context, generator)
        noise = torch.randn(scored.shape, generator=generator).to(self.device)
        judged = None
        if context:  # the fake score learns the judged chunks only, read after the same context
            judged = torch.ones((batch, scored.shape[2], *scored.shape[3:]), device=self.device)
            judged[:, :context] = 0
        out["critic_loss"] = flow_matching_loss(
            self.modules.fake_score,
            scored,
            text,
            sigma.to(self.device),
            noise,
            self.pattern,
            self.autocast,
            weight=judged,
        )
        out["loss"] = loss + out["critic_loss"]
        return out

    # ---------------------------------------------------------------- export
    def export(self, weights: DistillModules) -> Path:
        """``run_dir/transformer`` (the student's EMA weights); for MiniLM models also
        ``run_dir/pipeline``, a complete pipeline folder set to the student's steps and sampler."""
        run_dir = Path(self.config.run_dir)
        student = weights.generator
        student.save_pretrained(run_dir / "transformer", safe_serialization=True)
        if self.pipe_config.model.text_encoder != "umt5":
            vae = loading.load_vae(self.teacher.folder, self.pipe_config)
            loading.save_components(
                run_dir / "pipeline",
                copy.deepcopy(student).cpu(),
                vae,
                self.teacher.text_encoder,
                self.pipe_config.replace(**{"runtime.device": "cpu"}),
            )
        return run_dir / "transformer"


def train_distill(config: DistillTrainConfig, teacher: Teacher | None = None) -> Path:
    """Run (or continue) a distillation stage; returns the exported student transformer folder."""
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    distiller = Distiller(config, teacher)
    modules = distiller.modules
    groups = [{"params": list(modules.generator.parameters()), "lr_scale": 1.0}]
    if modules.fake_score is not None:
        groups.append(
            {"params": list(modules.fake_score.parameters()), "lr_scale": config.fake_score_lr / config.lr}
        )
    optimizer = torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.999))
    run = TrainingRun(config, modules, optimizer, lr_floor=1.0)
    pool, prompts = None, None
    if config.stage == "ode" or config.regression_weight > 0:
        pool, prompts = distiller.ode_pool()
    metrics: dict[str, float] = {}
    while not run.done:
        if config.stage == "ode":
            assert pool is not None and prompts is not None
            out = distiller.ode_step(run.step, pool, prompts)
        else:
            out = distiller.self_forcing_step(run.step, pool, prompts)
        # the latest of each (a generator loss comes every generator_every steps)
        metrics.update({k: float(v.detach()) for k, v in out.items() if k != "loss"})
        if not run.update(out["loss"], **metrics):
            break
    latest = run.finish()
    return distiller.export(run.ema.model) if run.done else latest
