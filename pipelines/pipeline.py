"""``LongVideoPipeline``: a prompt or a storyboard in, a video of any length out, chunk by chunk.

``stream`` is the primitive: a generator that yields each chunk as soon as it is decoded;
``__call__`` collects it. One chunk, from prompt to frames:

1. the planner says what the chunk is (frames, prompt, context, drift actions);
2. due drift actions run (KV re-cache under a new prompt, periodic re-cache);
3. the denoiser makes the chunk's latents from seeded noise against the KV cache, at the noise
   levels the plan gives (the executor, :mod:`vidgen.pipelines.run`, runs the plan as it is);
4. statistics anchoring pulls drifted latents back; the chunk's clean latents are written into the
   cache, seeing only the sinks and itself, so the held latents alone determine the cache;
5. the streaming decoder turns the latents into frames; the drift monitor measures the chunk.

Every chunk's noise comes from ``(seed, chunk index)``, so a chunk is the same whether the video is
streamed, collected, or resumed from a saved state.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vidgen.attention import attention_backend
from vidgen.attention.cache import LRUCache
from vidgen.config import VidgenConfig
from vidgen.models import CausalWanTransformer, TextContext
from vidgen.pipelines import loading
from vidgen.pipelines.budget import check_memory
from vidgen.pipelines.denoiser import Conditioning
from vidgen.pipelines.lora import LongVideoLoraLoaderMixin
from vidgen.pipelines.plan import ChunkPlan, ChunkPlanner, PlannedChunk, PromptChange
from vidgen.pipelines.run import ChunkMetrics as ChunkMetrics
from vidgen.pipelines.run import VideoRun, flow_schedule
from vidgen.pipelines.run import _chunk_generator as _chunk_generator
from vidgen.pipelines.run import autocast_dtype as autocast_dtype
from vidgen.pipelines.run import decode_to_frames as decode_to_frames
from vidgen.pipelines.state_file import check_overwritable, check_state_path
from vidgen.pipelines.vae_stream import encode_video, spatial_factor, temporal_factor
from vidgen.request import prompt_changes
from vidgen.validation import InputError, check_guidance, check_number, check_seed, check_text, is_blank

Storyboard = list[tuple[float, str]]

if TYPE_CHECKING:
    from vidgen.models.quantization import QuantizeKind


@dataclass
class VideoChunk:
    index: int
    frame_start: int
    """Index of the chunk's first frame in the generated video."""
    start_time: float
    frames: np.ndarray
    """(T, H, W, 3) uint8 RGB."""
    prompt: str
    metrics: ChunkMetrics
    latents: torch.Tensor | None = None
    """(1, C, F, h, w) normalised latents of the chunk."""


@dataclass
class LongVideoPipelineOutput:
    frames: Any
    """(T, H, W, 3) float in [0, 1] (np), (T, 3, H, W) tensor (pt), PIL images (pil) or latents."""
    chunks: list[ChunkMetrics] = field(default_factory=list)
    fps: int = 16
    """Frame rate of the video (the pipeline's ``generation.fps``)."""

    def save(self, path: str | os.PathLike, *, upscale: Any = 1) -> Path:
        """Write the video as an H.264 MP4 (``upscale``: a factor or ``vidgen.video.Upscale``
        for a bigger file; the frames keep their size). Returns the path."""
        from vidgen.video.export import export_to_video

        return export_to_video(self.frames, path, fps=self.fps, upscale=upscale)


class StreamControl:
    """Steers a running ``stream``: change the prompt from the next chunk, or stop."""

    def __init__(self) -> None:
        self._prompt: str | None = None
        self.stopped = False

    def change_prompt(self, prompt: str) -> None:
        """The prompt from the next chunk on: text that shows something (checked here, at the
        call, not when the stream reaches it)."""
        if is_blank(check_text("change_prompt's prompt", prompt)):
            raise InputError("change_prompt's prompt is empty: say what the video shows from here on")
        self._prompt = prompt

    def stop(self) -> None:
        self.stopped = True

    def take_prompt(self) -> str | None:
        prompt, self._prompt = self._prompt, None
        return prompt


class LongVideoPipeline(LongVideoLoraLoaderMixin):
    """Long-video generation with a causal Wan 2.1-compatible transformer (see module docstring).

    LoRA: ``load_lora_weights``, ``set_adapters``, ``fuse_lora``, ``unfuse_lora`` and
    ``unload_lora_weights`` as in diffusers' Wan pipelines (see :mod:`vidgen.pipelines.lora`)."""

    def __init__(
        self,
        transformer: CausalWanTransformer,
        vae,
        text_encoder,
        config: VidgenConfig | None = None,
    ) -> None:
        self.transformer = transformer
        self.vae = vae
        self.text_encoder = text_encoder
        self.config = config or VidgenConfig()
        self._text_contexts: LRUCache[TextContext] = LRUCache(maxsize=32)
        self._offload_hooks: list = []
        self._quantized: str | None = None
        self._progress_bar_config: dict[str, Any] = {}

    def set_progress_bar_config(self, **kwargs: Any) -> None:
        """tqdm options for ``__call__``'s progress bar, as in diffusers (``disable=True``: none)."""
        self._progress_bar_config = kwargs

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        path_or_name: str | os.PathLike | None = None,
        *,
        config: VidgenConfig | str | None = None,
        **overrides,
    ) -> LongVideoPipeline:
        """Load from a local folder, a Hugging Face id (``owner/name``, as diffusers; fetched into
        its cache unless ``HF_HUB_OFFLINE=1``), a preset name in ``configs/`` (its weights' ids),
        or (no argument) the embedded default model. ``config`` (a VidgenConfig, preset name or
        TOML path) replaces the folder's own; ``overrides`` are ``"table.key": value`` pairs."""
        from vidgen.config import load_config

        if isinstance(config, (str, os.PathLike)):
            config = load_config(config)
        chosen = overrides.get("model.path")
        if chosen:  # the weights to load: resolved here, or the setting would be silently ignored
            if path_or_name not in (None, "", "default") and str(path_or_name) != str(chosen):
                raise InputError(
                    f"model.path={chosen} and the model {path_or_name} disagree: give one of them"
                )
            path_or_name = chosen
        folder, config = loading.resolve_model(path_or_name, config)
        if overrides:
            config = config.replace(**overrides)
        loading.check_attention_backend(config)
        loading.apply_threads(config.runtime.threads)
        transformer = loading.load_transformer(folder, config)
        vae = loading.load_vae(folder, config)
        text_encoder = loading.load_text_encoder(folder, config)
        pipe = cls(transformer, vae, text_encoder, config)
        pipe.apply_config_loras([*filter(None, [config.model.transformer_lora]), *config.model.loras])
        device = pipe.device_from_config()
        if config.runtime.quantize != "none":
            pipe.quantize(config.runtime.quantize, config.runtime.quantize_text_encoder, device)
        if config.runtime.cpu_offload and device.type != "cpu":
            pipe.enable_model_cpu_offload(device)
        else:
            pipe.to(device)
        if config.runtime.compile:
            pipe.compile()
        return pipe

    def quantize(
        self,
        kind: QuantizeKind = "int8",
        text_encoder: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        """Quantize the transformer blocks' linear layers (and the text encoder's) in place with
        torchao: ``int8`` weight-only or ``fp8`` (see ``vidgen.models.quantization``)."""
        from vidgen.models.quantization import quantize_linears

        quantize_linears(self.transformer, kind, device=device)
        self._quantized = kind
        if text_encoder:
            quantize_linears(self.text_encoder, kind, device=device, under="")
            self.text_encoder.to(self.text_encoder.device)  # moving drops its cached prompt embeddings
        self._text_contexts.clear()

    def compile(self, mode: str | None = None) -> None:
        """torch.compile the transformer's blocks as one graph (see
        ``CausalWanTransformer.compile_blocks``); the KV cache bookkeeping stays eager, around it.
        The first chunks pay the compile time, one graph per cache fill level.
        ``mode``: torch.compile's mode (default: ``runtime.compile_mode``)."""
        mode = mode or self.config.runtime.compile_mode
        self.transformer.compile_blocks(mode=None if mode == "default" else mode)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        if getattr(self.transformer, "peft_config", None):  # peft's layers would be saved under other names
            raise InputError(
                "the transformer carries LoRA adapters: call fuse_lora() then unload_lora_weights() "
                "(or just unload_lora_weights()) before save_pretrained"
            )
        if self._quantized:
            raise InputError(
                f"this pipeline's weights are {self._quantized}-quantized: save the float model and "
                f"quantize when loading (runtime.quantize = {self._quantized!r})"
            )
        loading.save_components(Path(path), self.transformer, self.vae, self.text_encoder, self.config)

    def device_from_config(self) -> torch.device:
        device = self.config.runtime.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise InputError("runtime.device='cuda' but torch sees no CUDA device; use device='cpu'")
        return torch.device(device)

    @property
    def device(self) -> torch.device:
        return self.transformer.device

    def to(self, device: torch.device | str) -> LongVideoPipeline:
        self.transformer.to(device)  # type: ignore[arg-type]  # diffusers types .to() as its own wrapper
        self.vae.to(device)
        self.text_encoder.to(device)
        self._text_contexts.clear()
        return self

    def enable_model_cpu_offload(self, device: torch.device | str = "cuda") -> None:
        """Keep each component on the CPU until it runs (accelerate hooks), so a 1.3B model fits a
        consumer GPU: the text encoder, transformer and VAE take turns on ``device``."""
        from accelerate import cpu_offload_with_hook

        hook = None
        self._offload_hooks = []
        for module in (self.text_encoder, self.transformer, self.vae):
            module.to("cpu")  # type: ignore[arg-type]  # diffusers types .to() as its own wrapper
            _, hook = cpu_offload_with_hook(module, torch.device(device), prev_module_hook=hook)
            self._offload_hooks.append(hook)

    # ------------------------------------------------------------------ geometry
    @property
    def temporal_factor(self) -> int:
        return temporal_factor(self.vae)

    def latent_size(self, height: int, width: int) -> tuple[int, int]:
        s = spatial_factor(self.vae)
        p_h, p_w = self.transformer.config.patch_size[1:]
        if height % (s * p_h) or width % (s * p_w) or height <= 0 or width <= 0:
            raise InputError(
                f"height and width must be positive multiples of {s * p_h} for this model, got {width}x{height}"
            )
        rope = getattr(self.transformer.config, "rope_max_seq_len", None)
        if rope and max(height, width) > rope * s * max(p_h, p_w):
            raise InputError(
                f"height and width must be at most {rope * s * max(p_h, p_w)} for this model "
                f"(its positional table), got {width}x{height}"
            )
        return height // s, width // s

    # ------------------------------------------------------------------ prompts
    def _embed(self, prompt: str) -> torch.Tensor:
        return self.text_encoder(prompt).to(self.device)

    def _text_context(self, prompt: str, previous: str | None, weight: float) -> TextContext:
        """Cross-attention context for a chunk's prompt, following the model's text conditioning."""
        with_previous = self.config.model.text_conditioning == "with_previous"
        key = (prompt, previous if (with_previous or weight < 1) else None, round(weight, 4), with_previous)

        def build() -> TextContext:
            current = self._embed(prompt)
            if with_previous:
                text = torch.cat([current, self._embed(previous if previous is not None else prompt)], dim=1)
            elif previous is not None and weight < 1:
                text = weight * current + (1 - weight) * self._embed(previous)  # a blended transition
            else:
                text = current
            with torch.no_grad():
                return self.transformer.encode_text(text)

        return self._text_contexts.get_or_create(key, build)

    def _conditioning(self, chunk: PlannedChunk, guidance_scale: float, negative_prompt: str) -> Conditioning:
        cond = self._text_context(chunk.prompt, chunk.previous_prompt, chunk.prompt_weight)
        if guidance_scale == 1.0:
            return Conditioning(cond)
        uncond = self._text_context(negative_prompt, None, 1.0)
        return Conditioning(cond, uncond, guidance_scale)

    # ------------------------------------------------------------------ planning
    def _check_request(
        self, prompt, storyboard, num_frames, seconds, fps, config=None, steps=None, guidance=None
    ) -> tuple[list[PromptChange], int | None]:
        """The storyboard as prompt changes and the length in frames (None: no end); every number
        finite and within the config's limits, else :class:`InputError`."""
        config = config or self.config
        changes = []
        for i, (start, text) in enumerate(prompt_changes(prompt, storyboard)):
            if start > config.generation.max_seconds:
                raise InputError(
                    f"storyboard entry {i} starts at {start:g} s, after the longest video "
                    f"(generation.max_seconds = {config.generation.max_seconds:g})"
                )
            changes.append(PromptChange(start, text))
        g = config.generation
        if num_frames is None and seconds is not None:
            seconds = check_number("seconds", seconds, positive=True)
            if seconds > g.max_seconds:
                raise InputError(
                    f"seconds must be at most {g.max_seconds:g} (generation.max_seconds), got {seconds:g}"
                )
            num_frames = max(1, round(seconds * fps))
        if num_frames is not None:
            num_frames = check_number("num_frames", num_frames, integer=True, positive=True)
            limit = min(g.max_seconds * fps, g.max_frames)
            if num_frames > limit:
                raise InputError(
                    f"the video length must be between 1 frame and {g.max_seconds:g} s "
                    f"(generation.max_seconds) or {g.max_frames} frames (generation.max_frames), "
                    f"got {num_frames} frames at {fps} fps"
                )
        if steps is not None:
            steps = check_number("num_inference_steps", steps, integer=True, positive=True)
            if steps > g.max_steps:
                raise InputError(
                    f"num_inference_steps must be at most {g.max_steps} (generation.max_steps), got {steps}"
                )
        if guidance is not None:
            check_guidance("guidance_scale", guidance)
        return changes, num_frames

    def _planner(
        self,
        config: VidgenConfig,
        changes: list[PromptChange],
        num_inference_steps: int,
        prefix_latents: int = 0,
    ) -> ChunkPlanner:
        g, d = config.generation, config.drift
        schedule = flow_schedule(g, num_inference_steps)
        return ChunkPlanner(
            chunk_frames=g.chunk_frames,
            sink_frames=g.sink_frames,
            window_frames=g.window_frames,
            temporal_factor=self.temporal_factor,
            fps=g.fps,
            sigmas=schedule.sigmas,
            storyboard=changes,
            transition_chunks=g.transition_chunks,
            recache_on_prompt_change=d.recache_on_prompt_change,
            recache_every=d.recache_every,
            mode=g.mode,
            ar_step=g.ar_step,
            prefix_latents=prefix_latents,
        )

    def plan(
        self,
        prompt: str | None = None,
        *,
        storyboard: Storyboard | None = None,
        num_frames: int | None = None,
        seconds: float | None = None,
        height: int | None = None,
        width: int | None = None,
        num_inference_steps: int | None = None,
        seed: int | None = None,
        guidance_scale: float | None = None,
    ) -> ChunkPlan:
        """The chunk plan of a request, without running anything; a request that cannot be made
        (numbers, sizes, the memory it would need) raises :class:`InputError`."""
        planner, num_frames, height, width = self._checked_planner(
            prompt, storyboard, num_frames, seconds, height, width, num_inference_steps, seed, guidance_scale
        )
        assert num_frames is not None  # a plan needs a length: _checked_planner says so
        return ChunkPlan(
            chunks=list(planner.chunks(num_frames)),
            num_frames=num_frames,
            fps=self.config.generation.fps,
            height=height,
            width=width,
            mode=planner.mode,
            seed=seed,
        )

    def check_inputs(
        self,
        prompt: str | None = None,
        *,
        storyboard: Storyboard | None = None,
        num_frames: int | None = None,
        seconds: float | None = None,
        height: int | None = None,
        width: int | None = None,
        num_inference_steps: int | None = None,
        seed: int | None = None,
        guidance_scale: float | None = None,
        negative_prompt: str | None = None,
        generator: torch.Generator | int | None = None,
        overrides: dict[str, Any] | None = None,
        image: Any = None,
        video: Any = None,
        include_input: bool = False,
    ) -> ChunkPlanner:
        """What :meth:`stream` and :meth:`plan` check, without laying out a chunk: an hour-long
        request costs what a second does, and no length (``stream`` until stopped) is allowed.
        Takes ``stream``'s request arguments (``GenerationRequest.stream_kwargs()``); the start
        frames (``image``, ``video``, ``include_input``) are read by ``stream``, not here. Returns
        the request's (lazy) planner; raises :class:`InputError` as ``plan``."""
        if isinstance(generator, int):
            seed = seed_of(generator)
        config = self.config.replace(**overrides) if overrides else self.config
        if negative_prompt is not None:
            check_text("negative_prompt", negative_prompt)
        request = (prompt, storyboard, num_frames, seconds, height, width, num_inference_steps, seed)
        planner, *_ = self._checked_planner(*request, guidance_scale, config, need_length=False)
        return planner

    def _checked_planner(
        self, prompt, storyboard, num_frames, seconds, height, width, steps, seed, guidance_scale,
        config: VidgenConfig | None = None, need_length: bool = True,
    ) -> tuple[ChunkPlanner, int | None, int, int]:  # fmt: skip
        config = config or self.config
        loading.check_attention_backend(config)
        g = config.generation
        height, width = _size(height, g.height, "height"), _size(width, g.width, "width")
        self.latent_size(height, width)
        changes, num_frames = self._check_request(
            prompt, storyboard, num_frames, seconds, g.fps, config, steps=steps, guidance=guidance_scale
        )
        if num_frames is None and need_length:
            raise InputError("a plan needs num_frames= or seconds=")
        if seed is not None:
            check_seed("seed", seed)
        guidance = g.guidance_scale if guidance_scale is None else guidance_scale
        check_memory(self, config, height, width, guidance)
        planner = self._planner(config, changes, steps or g.num_inference_steps)
        if g.rope_mode == "absolute" and num_frames is not None:
            positions = self.transformer.config.rope_max_seq_len
            for chunk in planner.chunks(num_frames):
                if chunk.latent_end > positions:
                    raise InputError(
                        f"{num_frames} frames need latent frame positions past {positions} (the model's "
                        f"rope_max_seq_len), where positions at each frame's index (generation.rope_mode = "
                        f"'absolute', as the published model) end; make the video at most "
                        f"{chunk.frame_start / g.fps:g} s, or set generation.rope_mode=rolling"
                    )
        return planner, num_frames, height, width

    # ------------------------------------------------------------------ streaming
    def stream(
        self,
        prompt: str | None = None,
        *,
        storyboard: Storyboard | None = None,
        num_frames: int | None = None,
        seconds: float | None = None,
        height: int | None = None,
        width: int | None = None,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        negative_prompt: str | None = None,
        generator: torch.Generator | int | None = None,
        video: np.ndarray | torch.Tensor | str | os.PathLike | None = None,
        image: np.ndarray | str | os.PathLike | None = None,
        include_input: bool = False,
        control: StreamControl | None = None,
        state_path: str | os.PathLike | None = None,
        resume: bool = False,
        callback_on_step_end: Callable | None = None,
        return_latents: bool = False,
        overrides: dict[str, Any] | None = None,
        decode: bool = True,
    ) -> Iterator[VideoChunk]:
        """Yield :class:`VideoChunk` s as they are decoded.

        ``num_frames`` / ``seconds`` None: no end (stop with ``control.stop()``). ``video`` / ``image``:
        a clip or frame (arrays, or a video / image file) whose continuation is generated: it is
        resized to the video's size as diffusers' ``VideoProcessor`` does (a stretch, Lanczos) if
        it differs, encoded and prefilled into the cache; ``num_frames``, ``seconds`` and storyboard
        times count the generated frames. ``include_input=True``: the first chunk opens with the
        given frames (the newest ``1 + 4k`` after the autoencoder round trip, any older ones as
        given) and every ``frame_start`` counts them, so the chunks make the whole video.
        ``state_path``: after every chunk the generation state is saved there (latents, not the KV
        cache, which is rebuilt from them); with ``resume=True`` a saved state is loaded first and
        generation continues after its last complete chunk, with the frames of an uninterrupted run.
        ``overrides``: ``"table.key": value`` config changes for this video only (window, sinks,
        drift options, attention backend, ...). ``decode=False``: chunks carry their latents and no
        frames, for a decoder elsewhere (:func:`decode_to_frames`, fed the chunks in order); the
        saved state then holds no decoder state.
        """
        config = self.config.replace(**overrides) if overrides else self.config
        g = config.generation
        # 1. check inputs
        height, width = _size(height, g.height, "height"), _size(width, g.width, "width")
        latent_h, latent_w = self.latent_size(height, width)
        changes, num_frames = self._check_request(
            prompt,
            storyboard,
            num_frames,
            seconds,
            g.fps,
            config,
            steps=num_inference_steps,
            guidance=guidance_scale,
        )
        steps = num_inference_steps or g.num_inference_steps
        guidance = g.guidance_scale if guidance_scale is None else guidance_scale
        negative = check_text(
            "negative_prompt", g.negative_prompt if negative_prompt is None else negative_prompt
        )
        seed = seed_of(generator)
        if control is not None and not (
            hasattr(control, "stopped") and callable(getattr(control, "take_prompt", None))
        ):  # a StreamControl, or one that stands in for it (sequence parallelism's broadcast)
            raise InputError(f"control= must be a StreamControl, got {type(control).__name__}")
        if state_path is not None:  # neither read nor overwritten unless it is a vidgen state
            if not Path(state_path).parent.is_dir():
                raise InputError(f"state_path {state_path}: its folder does not exist")
            check_state_path(state_path)
            if not resume:
                check_overwritable(state_path)
        check_memory(self, config, height, width, guidance)

        # the attention backend is entered per step, never held across a yield: a consumer may
        # advance this generator from different threads (Gradio does)
        backend = config.runtime.attention_backend or None
        # 2. continuation: encode and prefill a clip or an image
        clip = self._input_clip(video, image, height, width)
        prefix = clip.latents if clip is not None else None
        if include_input and clip is not None and not decode:
            raise InputError("include_input needs the frames decoded here (decode=True)")
        offset = len(clip.frames) if include_input and clip is not None else 0
        opening = None
        planner = self._planner(
            config, changes, steps, prefix_latents=prefix.shape[2] if prefix is not None else 0
        )
        run = VideoRun(
            self,
            config,
            planner,
            latent_h,
            latent_w,
            guidance,
            seed,
            steps,
            decode=decode,
            num_frames=num_frames,
        )
        run.keep_replay = state_path is not None
        resumed_from = -1
        if resume and state_path is not None and Path(state_path).is_file():
            with attention_backend(backend):
                resumed_from = run.load(state_path, negative)
        elif prefix is not None:
            with attention_backend(backend):
                decoded = run.prefill(prefix, negative)
            if offset:
                assert clip is not None  # an offset comes from a clip
                opening = np.concatenate([clip.frames[: len(clip.frames) - clip.kept], decoded])

        # 3. the plan, then chunk by chunk
        started = time.perf_counter()
        made_seconds = 0.0
        for chunk in planner.chunks(num_frames):
            if chunk.index <= resumed_from:
                continue
            if control is not None and control.stopped:
                break
            with attention_backend(backend):
                out = run.make_chunk(chunk, negative, callback_on_step_end)
            frames = out.frames
            if num_frames is not None:
                frames = frames[: max(0, num_frames - chunk.frame_start)]
            made_seconds += len(frames) / g.fps
            elapsed = time.perf_counter() - started
            out.metrics.video_seconds = len(frames) / g.fps
            out.metrics.real_time_factor = made_seconds / max(elapsed, 1e-9)
            frame_start = chunk.frame_start + offset
            if opening is not None and chunk.index == 0:
                frames, frame_start = np.concatenate([opening, frames]), 0
            yield VideoChunk(
                index=chunk.index,
                frame_start=frame_start,
                start_time=chunk.start_time,
                frames=frames,
                prompt=chunk.prompt,
                metrics=out.metrics,
                latents=out.latents if return_latents or not decode else None,
            )
            if state_path is not None:
                # saved once the consumer has taken the chunk: a consumer that records chunks
                # and is killed never finds a state ahead of its recording
                run.save(state_path, chunk.index)
            new_prompt = control.take_prompt() if control is not None else None
            if new_prompt and new_prompt.strip():
                # applies from the next chunk: the planner reads the storyboard as it goes
                planner.add_change(chunk.frame_end / g.fps, new_prompt.strip())

    def __call__(
        self,
        prompt: str | None = None,
        *,
        output_type: str = "np",
        return_dict: bool = True,
        **kwargs: Any,
    ) -> LongVideoPipelineOutput | tuple:
        """The whole video at once (built on :meth:`stream`; same arguments, same frames), with a
        tqdm progress bar of frames made (:meth:`set_progress_bar_config` sets it up or off)."""
        if kwargs.get("num_frames") is None and kwargs.get("seconds") is None:
            raise InputError("pass num_frames= or seconds= (stream() runs without end)")
        if output_type not in ("np", "pt", "pil", "latent"):
            raise InputError(f"output_type must be 'np', 'pt', 'pil' or 'latent', got {output_type!r}")
        config = self.config.replace(**kwargs["overrides"]) if kwargs.get("overrides") else self.config
        fps = config.generation.fps
        _, total = self._check_request(
            prompt, kwargs.get("storyboard"), kwargs.get("num_frames"), kwargs.get("seconds"), fps, config
        )
        chunks = []
        with self.progress_bar(total=total, unit="frame") as bar:
            for chunk in self.stream(prompt, return_latents=output_type == "latent", **kwargs):
                chunks.append(chunk)
                bar.update(len(chunk.frames))
        metrics = [c.metrics for c in chunks]
        if output_type == "latent":
            frames: Any = torch.cat([c.latents for c in chunks if c.latents is not None], dim=2)
        else:
            video = np.concatenate([c.frames for c in chunks])  # (T, H, W, 3) uint8
            if output_type == "np":
                frames = video.astype(np.float32) / 255.0
            elif output_type == "pt":
                frames = torch.from_numpy(video).permute(0, 3, 1, 2).float() / 255.0
            else:
                from PIL import Image

                frames = [Image.fromarray(f) for f in video]
        if not return_dict:
            return (frames,)
        return LongVideoPipelineOutput(frames=frames, chunks=metrics, fps=fps)

    def progress_bar(self, **kwargs: Any):
        """A tqdm bar with :meth:`set_progress_bar_config`'s options on top of ``kwargs``."""
        from tqdm.auto import tqdm

        return tqdm(**{**kwargs, **self._progress_bar_config})

    # ------------------------------------------------------------------ helpers
    def _input_clip(self, video, image, height: int, width: int) -> _InputClip | None:
        if video is None and image is None:
            return None
        if video is not None and image is not None:
            raise InputError("pass video= or image=, not both")
        from vidgen.video.reading import image_size, probe_video, read_image, read_video

        name = "image=" if image is not None else "video="
        resized = False
        try:  # a file that cannot be read is the user's to fix
            if isinstance(image, (str, os.PathLike)):  # decoded at the video's size: never more
                resized = image_size(image) != (width, height)
                frames = read_image(image, size=(height, width))[None]
            elif image is not None:
                frames = np.asarray(image)[None]
            elif isinstance(video, (str, os.PathLike)):
                info = probe_video(video)
                resized = (info["height"], info["width"]) != (height, width)
                frames, _ = read_video(video, size=(height, width))
            else:
                frames = np.asarray(video) if not torch.is_tensor(video) else video.cpu().numpy()
        except (FileNotFoundError, ValueError) as err:
            raise InputError(f"{name} {str(err).splitlines()[0]}") from None
        if frames.ndim != 4 or frames.shape[-1] != 3 or 0 in frames.shape:
            raise InputError(f"{name} must be frames (T, H, W, 3), got shape {tuple(frames.shape)}")
        if frames.dtype.kind not in "uif" or frames.dtype.kind == "f" and not np.isfinite(frames).all():
            raise InputError(f"{name} must hold finite numbers (uint8, or floats in [0, 1]), got NaN or inf")
        if resized:  # as resize_video's VideoProcessor turns its resized uint8 frames into [-1, 1]
            tensor = 2.0 * torch.from_numpy(frames.astype(np.float32) / 255.0) - 1.0
        else:
            tensor = torch.tensor(frames, dtype=torch.float32)  # a copy: the caller's array may be read-only
            tensor = tensor / 127.5 - 1.0 if frames.dtype == np.uint8 else tensor * 2.0 - 1.0
        tensor = tensor.permute(3, 0, 1, 2)[None]  # (1, 3, T, H, W) in [-1, 1]
        if frames.shape[1:3] != (height, width):
            tensor = resize_video(tensor, height, width)
        uint8 = ((tensor[0].permute(1, 2, 3, 0) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
        t = self.temporal_factor
        kept = 1 + ((tensor.shape[2] - 1) // t) * t  # whole latent frames; the newest frames are kept
        latents = encode_video(self.vae, tensor[:, :, tensor.shape[2] - kept :].to(self.device))
        return _InputClip(latents=latents, frames=uint8, kept=kept)


@dataclass
class _InputClip:
    latents: torch.Tensor
    """(1, C, F, h, w) normalised latents of the newest ``kept`` frames."""
    frames: np.ndarray
    """(T, H, W, 3) uint8: every given frame, at the video's size."""
    kept: int


def resize_video(video: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(B, 3, T, H, W) in [-1, 1] to ``height`` x ``width`` as diffusers' ``VideoProcessor`` resizes
    PIL frames (``resize_mode="default"``: a Lanczos stretch to the size, no crop, no padding)."""
    from diffusers.video_processor import VideoProcessor
    from PIL import Image

    frames = ((video[0].permute(1, 2, 3, 0) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
    processor = VideoProcessor(vae_scale_factor=1)
    return processor.preprocess_video(
        [Image.fromarray(f) for f in frames], height=height, width=width
    ).float()


def seed_of(generator: torch.Generator | int | None) -> int:
    """The seed a ``generator`` argument stands for (a random one for None), checked."""
    if generator is None:
        return int(torch.randint(0, 2**31 - 1, (1,)).item())
    if isinstance(generator, torch.Generator):
        return int(generator.initial_seed())
    if isinstance(generator, bool) or not isinstance(generator, int):
        raise InputError(
            f"generator must be a torch.Generator or an int seed, got {type(generator).__name__}"
        )
    return check_seed("generator", generator)


def _size(value: int | None, default: int, name: str) -> int:
    """``height`` / ``width``: the config's when None; 0 is refused, not replaced."""
    if value is None:
        return default
    return check_number(name, value, integer=True, positive=True)
