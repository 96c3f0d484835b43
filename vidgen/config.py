"""Typed configuration: TOML presets in ``configs/`` load into these dataclasses.

A config has four tables -- ``[model]`` (which weights and components), ``[generation]`` (chunking,
context window, sampler), ``[drift]`` (drift-correction switches) and ``[runtime]`` (device, dtype,
attention backend, compile, offload). Unknown keys are an error that names the key; every field
is validated in ``__post_init__`` with a message that says what to change.

Presets: ``default`` (the embedded Shapes World model), ``wan2.1-t2v-1.3b-causal`` (local Wan 2.1
causal weights), and the published systems with their own settings: ``self-forcing``,
``self-forcing-framewise``, ``causvid``, ``longlive``, ``rolling-forcing``. ``load_config("default")`` reads a preset by name,
``load_config("path/to/file.toml")`` a file; ``config.replace(**{"generation.window_frames": 8})``
applies overrides.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field, fields
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args, get_type_hints

from vidgen.validation import MAX_GUIDANCE, InputError, check_text, parse_toml, read_text_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(InputError):
    """A config value or key that cannot be used; the message says what to change."""


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}")


def _check_positive(name: str, value: float, allow_zero: bool = False) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{name} must be {bound}, got {value}")


class Choice(str, Enum):
    """A config choice with behaviour attached: equal to its string, written as its string (TOML,
    JSON, messages), so a config file holds the plain word."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(str(c.value) for c in cls)


class GenerationMode(Choice):
    """How chunks are denoised (``generation.mode``)."""

    CHUNKWISE = "chunkwise"
    """One chunk at a time, each from noise to clean."""
    DIFFUSION_FORCING = "diffusion_forcing"
    """Several chunks in flight at staggered noise levels (``generation.ar_step`` apart), each
    seeing the ones before it (block-causal) and the cache as held."""
    ROLLING_FORCING = "rolling_forcing"
    """Rolling Forcing's window: the chunks in flight staggered as in diffusion forcing, but
    attending to each other both ways; each call sees, besides them, the sinks (placed just before
    what follows them) and the newest clean frames that fit in ``sink_frames + window_frames``
    frames of attention in all; a finished chunk's context pass sees the newest ``sink_frames +
    window_frames`` frames, itself included (the sinks only while those reach back to them)."""

    @property
    def staggered(self) -> bool:
        """Several chunks in flight, one model call advancing all of them."""
        return self is not GenerationMode.CHUNKWISE


class SamplerKind(Choice):
    """The few-step sampler (``generation.sampler``, see :mod:`vidgen.pipelines.scheduler`)."""

    EULER = "euler"
    """Integrates the flow."""
    X0_RENOISE = "x0_renoise"
    """Predicts the clean sample and re-noises it to the next level with fresh noise."""


TextEncoderKind = Literal["minilm", "umt5"]
VaeKind = Literal["lite", "wan"]
TextConditioning = Literal["single", "with_previous"]
RopeMode = Literal["absolute", "rolling"]
ContextPass = Literal["window", "sinks"]
AttentionSparsity = Literal["dense", "radial"]
Dtype = Literal["float32", "bfloat16", "float16"]
Autocast = Literal["auto", "off", "bfloat16"]
Device = Literal["auto", "cpu", "cuda"]
Quantize = Literal["none", "int8", "fp8"]
MAX_LORA_SCALE = 100.0
"""The largest LoRA weight a config may give (published LoRAs run at about 1)."""
MAX_TEXT_LENGTH = 4096
"""The most tokens per prompt (Wan 2.1 reads 512; the tokenizer allocates the whole length)."""
MIN_SHIFT = 1e-3
"""The smallest noise-schedule shift (its inverse the largest): past them the schedule degenerates."""

VOCABULARIES = {"shapes_world": "vidgen.shapes.vocabulary"}
"""Short names of vocabularies (``model.vocabulary``) and the modules that check prompts against them."""


def _importable(module: str) -> bool:
    """Whether ``module`` names an importable module (found, not imported)."""
    import importlib.util

    if not all(part.isidentifier() for part in module.split(".")):
        return False
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def vocabulary_module(vocabulary: str) -> str:
    """The import path of the module that checks prompts for ``model.vocabulary`` ("" for none)."""
    return VOCABULARIES.get(vocabulary, vocabulary)


SequenceParallelKind = Literal["auto", "ulysses", "ring"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"]


@dataclass
class ModelConfig:
    """Which weights and components make the pipeline."""

    path: str = ""
    """Folder of a saved pipeline (``model_index.json``), or a Hugging Face id (``owner/name``,
    fetched into its cache); empty: the embedded default model."""
    transformer: str = ""
    """Optional transformer checkpoint replacing the folder's: a causal Wan 2.1 file or folder
    (diffusers or original key layout), a published ``.pt`` (converted once, cached), or a hub id
    of one (``owner/name/path/in/repo``), e.g. Self Forcing's ``gdhe17/Self-Forcing/checkpoints/self_forcing_dmd.pt``."""
    transformer_key: str = ""
    """Which weights of a ``.pt`` training checkpoint ``transformer`` names (``generator_ema``,
    ``generator``...); empty: the first of ``vidgen convert``'s usual keys present."""
    transformer_lora: str = ""
    """A LoRA that is part of the published ``transformer`` (LongLive's ``lora.pt``), fused in at
    load time before ``loras``; ``--transformer`` on the command line clears it with the key."""
    loras: list[str] = field(default_factory=list)
    """LoRAs fused into the transformer at load time, each ``"PATH"`` or ``"PATH:SCALE"`` (a
    ``.safetensors`` or ``.pt`` file or a folder; diffusers, original Wan or LongLive layout)."""
    text_encoder: TextEncoderKind = "minilm"
    """Prompt encoder: ``minilm`` (ships with vidgen) or ``umt5`` (Wan 2.1, from the folder)."""
    text_max_length: int = 32
    """Tokens per prompt (Wan 2.1: 512)."""
    vae: VaeKind = "lite"
    """Autoencoder: ``lite`` (vidgen's AutoencoderKLLite) or ``wan`` (diffusers' AutoencoderKLWan)."""
    text_conditioning: TextConditioning = "single"
    """``with_previous``: the model reads ``[prompt ‖ previous prompt]`` and learned to apply what
    changed while a prompt change is fresh (the embedded model); ``single``: the prompt alone."""
    vocabulary: str = ""
    """What the weights understand: a module with ``prompt_warning(prompt) -> str | None`` that
    says what in a prompt they will not understand, named by its import path or a short name of
    :data:`VOCABULARIES` -- ``shapes_world`` (the embedded model: prompts get a warning
    naming the words it does not know); empty: open text, no check."""
    trained_sizes: str = ""
    """Frame sizes the weights were trained at, ``WxH`` comma-separated (e.g. ``64x64``); other
    sizes get a warning. Empty: any size."""

    def __post_init__(self) -> None:
        module = vocabulary_module(self.vocabulary)
        if module and not _importable(module):
            raise ConfigError(
                f"model.vocabulary={self.vocabulary!r} is not one of {sorted(VOCABULARIES)} nor the "
                "import path of a module with prompt_warning(prompt)"
            )
        for size in filter(None, (s.strip() for s in self.trained_sizes.split(","))):
            w, x, h = size.partition("x")
            if not (x and w.isdigit() and h.isdigit()):
                raise ConfigError(f"model.trained_sizes: {size!r} is not WxH, e.g. '64x64'")
        _check_choice("model.text_encoder", self.text_encoder, get_args(TextEncoderKind))
        _check_choice("model.vae", self.vae, get_args(VaeKind))
        _check_choice("model.text_conditioning", self.text_conditioning, get_args(TextConditioning))
        _check_positive("model.text_max_length", self.text_max_length)
        if any(not spec.strip() or spec.endswith(":") for spec in self.loras):
            raise ConfigError(f"model.loras: each entry is 'PATH' or 'PATH:SCALE', got {self.loras!r}")
        for spec in [*self.loras, *filter(None, [self.transformer_lora])]:
            _, scale = parse_lora_spec(spec)
            if not (math.isfinite(scale) and abs(scale) <= MAX_LORA_SCALE):
                raise ConfigError(
                    f"a LoRA's scale must be a finite number between -{MAX_LORA_SCALE:g} and "
                    f"{MAX_LORA_SCALE:g}, got {scale!r} in {spec!r}"
                )
        if self.text_max_length > MAX_TEXT_LENGTH:
            raise ConfigError(
                f"model.text_max_length must be at most {MAX_TEXT_LENGTH} tokens, got {self.text_max_length}"
            )


@dataclass
class GenerationConfig:
    """How a video is cut into chunks and how each chunk is sampled."""

    height: int = 64
    width: int = 64
    fps: int = 16
    """Frames per second of the output video."""
    num_inference_steps: int = 4
    timesteps: list[float] = field(default_factory=list)
    """Explicit denoising timesteps (0-1000, decreasing; one per step) replacing the shifted
    uniform schedule, for models distilled on a fixed list (CausVid: [1000, 757, 522])."""
    guidance_scale: float = 1.0
    """Classifier-free guidance (1.0: off, one model call per step)."""
    negative_prompt: str = ""
    shift: float = 3.0
    """Noise-schedule shift (more steps at high noise)."""
    sampler: SamplerKind = SamplerKind.EULER
    chunk_frames: int = 2
    """Latent frames per chunk (``causal_block_size`` in diffusers' SkyReels-V2 naming)."""
    sink_frames: int = 2
    """Latent frames at the start of the video that every chunk keeps attending to (0: none)."""
    window_frames: int = 4
    """Latent frames of recent history each chunk attends to (the sliding window)."""
    rope_mode: RopeMode = "absolute"
    """Temporal positions. ``absolute`` (the published systems): a latent frame's position is its
    index in the video, as Self Forcing, CausVid and LongLive rotate their cached keys; limited to
    the model's rope_max_seq_len latent frames (Wan 2.1: 1024, about 4 min at 16 fps), where their
    code stops too. ``rolling`` (vidgen's option, LongLive's "infinite" block-relativistic
    positions): positions counted inside the attention context, sinks first, so they stay bounded
    for any length; identical to ``absolute`` until the window first slides."""
    context_pass: ContextPass = "window"
    """How a finished chunk is written into the KV cache as context. ``window`` (the published
    systems, and how they are trained): the chunk is run once more at the context noise level
    against everything the cache holds -- sinks, window and itself -- and a re-cache (a prompt
    change) is LongLive's one joint pass over the latest frames, sinks kept. ``sinks`` (vidgen's
    option, the embedded model's choice): every non-sink chunk sees only the sinks and itself, so
    the cache is a function of the few latents it holds and a resumed video rebuilds it exactly
    from them; a re-cache rewrites every held chunk that way."""
    mode: GenerationMode = GenerationMode.CHUNKWISE
    """``chunkwise``: one chunk at a time; ``diffusion_forcing``: several chunks in flight at
    staggered noise levels."""
    ar_step: int = 1
    """diffusion_forcing: sampler steps between the starts of consecutive chunks."""
    addnoise_condition: float = 0.0
    """Noise level (sigma, 0-1) of the context written to the cache (0: clean context)."""
    transition_chunks: int = 2
    """Chunks over which a prompt change is phased in."""
    max_seconds: float = 3600.0
    """Longest video a request may ask for (``--seconds``); generation itself has no limit."""
    attention: AttentionSparsity = "dense"
    """Self-attention of a chunk over the cache: ``dense`` (every cached key), or ``radial``: the
    nearest frames whole, a band of rows that narrows with temporal distance in the others and in
    the sinks (about 38 % of the keys at Wan-1.3B's 832x480, see ``AttentionPattern.radial``)."""
    max_frames: int = 200_000
    """Most frames a request may ask for (bounds ``max_seconds`` x ``fps``)."""
    max_steps: int = 1000
    """Most sampler steps per chunk a request may ask for (``--steps``)."""

    def __post_init__(self) -> None:
        for name in ("height", "width", "fps", "num_inference_steps", "chunk_frames", "ar_step"):
            _check_positive(f"generation.{name}", getattr(self, name))
        for name in ("sink_frames", "window_frames", "transition_chunks"):
            _check_positive(f"generation.{name}", getattr(self, name), allow_zero=True)
        _check_positive("generation.guidance_scale", self.guidance_scale)
        if self.guidance_scale > MAX_GUIDANCE:
            raise ConfigError(
                f"generation.guidance_scale must be at most {MAX_GUIDANCE:g}, got {self.guidance_scale}"
            )
        _check_positive("generation.shift", self.shift)
        if not MIN_SHIFT <= self.shift <= 1 / MIN_SHIFT:
            raise ConfigError(
                f"generation.shift must be between {MIN_SHIFT:g} and {1 / MIN_SHIFT:g} (Wan uses 3-8), got {self.shift:g}"
            )
        _check_positive("generation.max_seconds", self.max_seconds)
        _check_positive("generation.max_frames", self.max_frames)
        _check_positive("generation.max_steps", self.max_steps)
        if self.num_inference_steps > self.max_steps:
            raise ConfigError(
                f"generation.num_inference_steps={self.num_inference_steps} exceeds "
                f"generation.max_steps={self.max_steps}"
            )
        _check_choice("generation.sampler", self.sampler, SamplerKind.values())
        self.sampler = SamplerKind(self.sampler)
        _check_choice("generation.rope_mode", self.rope_mode, get_args(RopeMode))
        _check_choice("generation.context_pass", self.context_pass, get_args(ContextPass))
        _check_choice("generation.mode", self.mode, GenerationMode.values())
        self.mode = GenerationMode(self.mode)
        _check_choice("generation.attention", self.attention, get_args(AttentionSparsity))
        if not 0.0 <= self.addnoise_condition < 1.0:
            raise ConfigError(
                f"generation.addnoise_condition is a noise level in [0, 1), got {self.addnoise_condition}"
            )
        for name in ("sink_frames", "window_frames"):
            if getattr(self, name) % self.chunk_frames:
                raise ConfigError(
                    f"generation.{name}={getattr(self, name)} must be a multiple of chunk_frames={self.chunk_frames} "
                    "(the context is chunk-aligned)"
                )
        if self.sink_frames + self.window_frames == 0:
            raise ConfigError(
                "generation: sink_frames + window_frames must be > 0 (the KV cache needs a slot)"
            )
        if self.timesteps:
            if len(self.timesteps) != self.num_inference_steps:
                raise ConfigError(
                    f"generation.timesteps has {len(self.timesteps)} values: set num_inference_steps = "
                    f"{len(self.timesteps)}"
                )
            pairs = zip(self.timesteps, self.timesteps[1:])
            if not (self.timesteps[-1] > 0 and self.timesteps[0] <= 1000) or any(a <= b for a, b in pairs):
                raise ConfigError(
                    f"generation.timesteps must decrease within (0, 1000], got {self.timesteps}"
                )
        if self.mode == GenerationMode.ROLLING_FORCING and self.context_pass != "window":
            raise ConfigError(
                "generation.mode = 'rolling_forcing' writes its context against the newest frames: "
                "set generation.context_pass = 'window'"
            )
        if self.ar_step > self.num_inference_steps:
            raise ConfigError(
                f"generation.ar_step={self.ar_step} exceeds num_inference_steps={self.num_inference_steps}"
            )


@dataclass
class DriftConfig:
    """Drift correction; each switch is reported in the chunk metrics and measured by ``vidgen eval``."""

    recache_every: int = 0
    """Rebuild the KV cache from the clean latents every N chunks (0: never)."""
    recache_on_prompt_change: bool = True
    """Rebuild the KV cache under the new prompt when the prompt changes (as LongLive does)."""
    anchor_stats: bool = True
    """Keep each chunk's per-channel latent mean/std near those of the opening chunks."""
    anchor_chunks: int = 2
    """Opening chunks (after the start or a prompt change) that define the anchor."""
    anchor_strength: float = 0.5
    """How far (0-1) a chunk's statistics are pulled back towards the anchor."""
    anchor_tolerance: float = 0.1
    """Deviation (in units of the anchor's std) tolerated before anything is pulled."""
    monitor: bool = True
    """Report drift measures per chunk (stat distance, change energy, freeze, repetition)."""
    freeze_threshold: float = 0.002
    """Mean absolute latent change per frame under which a chunk counts as frozen."""

    def __post_init__(self) -> None:
        _check_positive("drift.recache_every", self.recache_every, allow_zero=True)
        _check_positive("drift.anchor_chunks", self.anchor_chunks)
        if not 0.0 <= self.anchor_strength <= 1.0:
            raise ConfigError(f"drift.anchor_strength must be in [0, 1], got {self.anchor_strength}")
        _check_positive("drift.anchor_tolerance", self.anchor_tolerance, allow_zero=True)
        _check_positive("drift.freeze_threshold", self.freeze_threshold, allow_zero=True)


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX-512 BF16 or AMX), from its flags in
    ``cpuinfo``. Elsewhere torch emulates it: slower than float32 (an AVX2 EPYC: training steps
    5x, autoencoder encodes 35x, measured)."""
    try:
        with open(cpuinfo) as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


@dataclass
class RuntimeConfig:
    """Where and how the models run."""

    device: Device = "auto"
    dtype: Dtype = "float32"
    """Transformer weights' dtype (bfloat16 on GPUs; float32 on CPU)."""
    autocast: Autocast = "auto"
    """Matmuls in bfloat16 with float32 weights: ``auto`` turns it on where the hardware computes
    bfloat16 natively (CUDA; CPUs with AVX-512 BF16 or AMX: about 2x faster per step there)."""
    attention_backend: str = ""
    """Force an attention backend (sdpa, flex, flash, xformers); empty: automatic."""
    compile: bool = False
    """torch.compile the transformer's blocks as one graph: on the default model ~1.2x faster per
    chunk on CPU, after ~2 minutes of compiling in the first chunks (for long renders)."""
    compile_mode: CompileMode = "default"
    """torch.compile's mode with ``compile``: ``reduce-overhead`` captures CUDA graphs (one per
    cache length: the shapes stop changing once the window is full), ``max-autotune-no-cudagraphs``
    tunes the GPU kernels."""
    cpu_offload: bool = False
    """Keep only the running component on the accelerator (accelerate hooks)."""
    threads: int = 0
    """CPU threads for torch (0: ``OMP_NUM_THREADS`` or a count already set with
    ``torch.set_num_threads`` if any, else the CPUs not kept busy by other processes)."""
    quantize: Quantize = "none"
    """Quantize the transformer blocks' linear layers with torchao: ``int8`` weight-only (CPU and
    GPU), ``fp8`` (fp8 matmuls on GPUs of compute capability >= 8.9, emulated elsewhere)."""
    quantize_text_encoder: bool = False
    """Quantize the text encoder's linear layers the same way (with ``quantize`` set)."""
    max_memory_gb: float = 0.0
    """Memory a request may need (the estimate of its KV cache, activations and decoding), in GB;
    0: most of what the machine has available when the request comes."""
    kv_snapshot_every: int = 0
    """``generation.context_pass = "window"`` with a saved state (``--resume``): every this many
    chunks the KV cache is written beside the state (``<state>.kv-<chunk>``), so a resume replays
    at most this many context passes and the state holds only the latents since; 0: no snapshot,
    a resume replays the video from its start (one model call per chunk). At Wan-1.3B's 832x480 a
    snapshot is about 287 MB per held latent frame (bf16): see README, "Resume"."""
    sp_kind: SequenceParallelKind = "auto"
    """Sequence parallelism (``--sp`` > 1): ``ulysses`` splits the attention heads (their number
    must divide by sp), ``ring`` passes keys/values around (any head count), ``auto`` takes
    Ulysses when the heads divide and ring otherwise."""

    def __post_init__(self) -> None:
        _check_choice("runtime.sp_kind", self.sp_kind, get_args(SequenceParallelKind))
        _check_choice("runtime.device", self.device, get_args(Device))
        _check_choice("runtime.quantize", self.quantize, get_args(Quantize))
        _check_choice("runtime.dtype", self.dtype, get_args(Dtype))
        _check_choice("runtime.autocast", self.autocast, get_args(Autocast))
        _check_choice("runtime.compile_mode", self.compile_mode, get_args(CompileMode))
        _check_positive("runtime.threads", self.threads, allow_zero=True)
        _check_positive("runtime.kv_snapshot_every", self.kv_snapshot_every, allow_zero=True)
        _check_positive("runtime.max_memory_gb", self.max_memory_gb, allow_zero=True)
        if self.attention_backend:
            _check_choice(
                "runtime.attention_backend", self.attention_backend, ("sdpa", "flex", "flash", "xformers")
            )


@dataclass
class VidgenConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    drift: DriftConfig = field(default_factory=DriftConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    # -------------------------------------------------------------- conversions
    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> VidgenConfig:
        tables = {f.name: f.type for f in fields(cls)}
        unknown = set(data) - set(tables)
        if unknown:
            raise ConfigError(
                f"{source}: unknown table [{sorted(unknown)[0]}]; tables are {', '.join(tables)}"
            )
        kwargs = {}
        hints = get_type_hints(cls)
        for name, table in data.items():
            if not isinstance(table, dict):
                raise ConfigError(f"{source}: [{name}] must be a table")
            kwargs[name] = _build(hints[name], table, f"{source}: {name}")
        return cls(**kwargs)

    def trained_sizes(self) -> list[tuple[int, int]]:
        """``model.trained_sizes`` as ``[(width, height), ...]`` (empty: any size)."""
        sizes = filter(None, (s.strip() for s in self.model.trained_sizes.split(",")))
        return [(int(w), int(h)) for w, _, h in (s.partition("x") for s in sizes)]

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain values (a :class:`Choice` as its string), as a TOML or JSON file holds them."""
        return {
            table: {key: str(v) if isinstance(v, Choice) else v for key, v in values.items()}
            for table, values in dataclasses.asdict(self).items()
        }

    def to_toml(self) -> str:
        lines = []
        for table, values in self.to_dict().items():
            lines.append(f"[{table}]")
            for key, value in values.items():
                lines.append(f"{key} = {_toml_value(value)}")
            lines.append("")
        return "\n".join(lines)

    def replace(self, **overrides: Any) -> VidgenConfig:
        """A copy with ``"table.key": value`` overrides (validated like a file)."""
        data = self.to_dict()
        for dotted, value in overrides.items():
            table, _, key = dotted.partition(".")
            if table not in data or not key:
                raise ConfigError(
                    f"override {dotted!r} must be 'table.key' with table one of {', '.join(data)}"
                )
            data[table][key] = value
        return VidgenConfig.from_dict(data, "overrides")


def _build(cls: type, values: dict[str, Any], source: str):
    names = {f.name for f in fields(cls)}
    unknown = set(values) - names
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"{source}: unknown key {key!r}; known keys: {', '.join(sorted(names))}")
    hints = get_type_hints(cls)
    for key, value in values.items():
        _check_type(f"{source}.{key}", value, hints[key])
    try:
        return cls(**values)
    except ConfigError as err:
        raise ConfigError(f"{source.split(':')[0]}: {err}") from None


def _check_type(name: str, value: Any, hint: Any) -> None:
    if getattr(hint, "__origin__", None) is list:
        item = get_args(hint)[0]
        kinds = (int, float) if item is float else item  # TOML writes 1000, not 1000.0
        if not isinstance(value, list) or not all(
            isinstance(v, kinds) and not isinstance(v, bool) for v in value
        ):
            raise ConfigError(f"{name} must be a list of {item.__name__}, got {value!r}")
        return
    base = hint
    if getattr(hint, "__origin__", None) is Literal:
        base = type(get_args(hint)[0])
    elif isinstance(hint, type) and issubclass(hint, Choice):
        base = str
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return
    if base in (int, float, str, bool) and (
        not isinstance(value, base) or (base is int and isinstance(value, bool))
    ):
        raise ConfigError(f"{name} must be {base.__name__}, got {type(value).__name__} {value!r}")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def parse_lora_spec(spec: str) -> tuple[str, float]:
    """A ``model.loras`` / ``--lora`` entry, ``PATH[:SCALE]`` -> (path, scale); the scale defaults to 1
    (a suffix that is not a number is part of the path)."""
    path, sep, scale = spec.rpartition(":")
    if sep and path:
        try:
            return path, float(scale)
        except ValueError:
            pass
    return spec, 1.0


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``--set`` values, ``["TABLE.KEY=VALUE", ...]`` -> ``{"TABLE.KEY": value}``; a value is read as
    TOML (``8``, ``true``, ``[1, 2]``) or else kept as a bare string."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or "." not in key:
            raise InputError(f"--set expects TABLE.KEY=VALUE, got {item!r}")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except ValueError:
            value = raw  # a bare string
        except RecursionError:
            raise InputError(f"--set {key.strip()}: the value is nested too deeply") from None
        for number in value if isinstance(value, list) else [value]:
            if isinstance(number, float) and not math.isfinite(number):
                raise InputError(f"--set {key.strip()}: must be a finite number, got {raw.strip()}")
        overrides[key.strip()] = (
            check_text(f"--set {key.strip()}", value) if isinstance(value, str) else value
        )
    return overrides


def check_override_names(overrides: dict[str, Any]) -> None:
    """:class:`ConfigError` for a ``"table.key"`` that no config has, worded as
    :meth:`VidgenConfig.replace` words it. Values are not checked: their limits may depend on the
    model's own config, which is read later."""
    hints = get_type_hints(VidgenConfig)
    for dotted in overrides:
        table, _, key = dotted.partition(".")
        if table not in hints or not key:
            raise ConfigError(f"override {dotted!r} must be 'table.key' with table one of {', '.join(hints)}")
        names = {f.name for f in fields(hints[table])}
        if key not in names:
            raise ConfigError(
                f"overrides: {table}: unknown key {key!r}; known keys: {', '.join(sorted(names))}"
            )


def lora_overrides(specs: list[str] | None) -> dict[str, list[str]]:
    """``--lora PATH[:SCALE]`` entries as ``model.loras`` (replacing the config's list), the paths
    made absolute (Ray workers may run in another folder); a missing file is an :class:`InputError`."""
    loras = []
    for spec in specs or []:
        path, scale = parse_lora_spec(spec)
        if not Path(path).expanduser().exists():
            raise InputError(f"--lora: no file at {path}")
        loras.append(f"{Path(path).expanduser().resolve()}:{scale!r}")
    return {"model.loras": loras} if loras else {}


def render_overrides(
    set_items: list[str] | None = None,
    *,
    fps: int | None = None,
    transformer: str | None = None,
    lora: list[str] | None = None,
    quantize: str | None = None,
    sp_kind: str | None = None,
) -> dict[str, Any]:
    """The config overrides of a render's options (``vidgen render``, a Ray worker's pipeline):
    ``--set`` first, then the named options, which win."""
    overrides = parse_overrides(list(set_items or []))
    if fps:
        overrides["generation.fps"] = fps
    if transformer:
        overrides["model.transformer"] = transformer
        # the preset's key and LoRA belong to its own checkpoint, not to this one (unless --set)
        overrides.setdefault("model.transformer_key", "")
        overrides.setdefault("model.transformer_lora", "")
    overrides.update(lora_overrides(lora))
    if quantize:
        overrides["runtime.quantize"] = quantize
    if sp_kind:
        overrides["runtime.sp_kind"] = sp_kind
    return overrides


def preset_names() -> list[str]:
    return sorted(
        p.name.removesuffix(".toml")
        for p in resources.files("vidgen.configs").iterdir()
        if p.name.endswith(".toml")
    )


def load_config(name_or_path: str | Path | None = None, **overrides: Any) -> VidgenConfig:
    """A preset by name (``default``, ``wan2.1-t2v-1.3b-causal``), or a TOML file, plus overrides."""
    if name_or_path is None or name_or_path == "":
        name_or_path = "default"
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            text, source = read_text_file(path, "config"), str(path)
        except InputError as err:
            raise ConfigError(str(err)) from None
    else:
        preset = resources.files("vidgen.configs") / f"{name_or_path}.toml"
        if not preset.is_file():
            raise ConfigError(f"unknown preset {str(name_or_path)!r}; presets: {', '.join(preset_names())}")
        text, source = preset.read_text(), f"preset {name_or_path}"
    try:
        data = parse_toml(text, source)
    except InputError as err:
        raise ConfigError(str(err)) from None
    config = VidgenConfig.from_dict(data, source)
    return config.replace(**overrides) if overrides else config
