"""The chunk planner: turns a request into an inspectable, serialisable list of chunk steps.

For every chunk the plan says which latent and video frames it makes, when it starts, what prompt
conditions it (with a transition over a few chunks after a storyboard change), which cached frames
it attends (sinks + sliding window), its noise levels, and the drift actions due at it. The
pipeline executes the plan; nothing in it depends on the model's outputs, so it can be printed,
saved and compared before anything runs.

The planner is lazy (:meth:`ChunkPlanner.chunks` is a generator), so an open-ended stream ("until
stopped") and prompt changes made while a video plays use the same code as a fixed request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum

from vidgen.config import GenerationMode
from vidgen.pipelines.vae_stream import frames_of_latents


class DriftAction(str, Enum):
    RECACHE_PROMPT = "recache_prompt"
    """Rebuild the KV cache under the chunk's (new) conditioning before denoising it."""
    RECACHE_PERIODIC = "recache_periodic"
    """Rewrite the KV cache from the clean latents. Every entry already depends only on the held
    latents, the sinks and the prompt, so this gives the same cache: kept for configurations that
    ask for it, it corrects nothing."""
    REANCHOR = "reanchor"
    """Start collecting new anchor statistics (the prompt changed what the video should look like)."""


@dataclass(frozen=True)
class PromptChange:
    start_seconds: float
    prompt: str


@dataclass
class PlannedChunk:
    index: int
    latent_start: int
    latent_end: int
    frame_start: int
    """First video frame this chunk decodes to (frames of a prefilled clip not counted)."""
    frame_end: int
    start_time: float
    """Seconds into the generated video at ``frame_start``."""
    prompt: str
    previous_prompt: str | None
    """During a transition: the prompt in effect before the change."""
    prompt_weight: float
    """Blend weight of ``prompt`` against ``previous_prompt`` for single-prompt models (1: all new)."""
    context: list[int]
    """Latent frames this chunk attends to: the sinks and the sliding window."""
    sigmas: list[float]
    actions: list[DriftAction] = field(default_factory=list)
    first_iteration: int = 0
    """diffusion_forcing: the model call at which this chunk starts denoising (its step ``s`` runs at
    call ``first_iteration + s``, with the chunks in flight then); 0 in chunkwise mode."""

    def to_dict(self) -> dict:
        data = asdict(self)
        data["actions"] = [a.value for a in self.actions]
        return data


@dataclass
class ChunkPlanner:
    """Lays out chunks for a video; geometry comes from the model, VAE and generation config."""

    chunk_frames: int
    sink_frames: int
    window_frames: int
    temporal_factor: int
    fps: int
    sigmas: Sequence[float]
    storyboard: list[PromptChange]
    transition_chunks: int = 0
    recache_on_prompt_change: bool = True
    recache_every: int = 0
    mode: GenerationMode = GenerationMode.CHUNKWISE
    ar_step: int = 1
    prefix_latents: int = 0
    """Latent frames already in the cache (a prefilled clip or image); generation starts after them."""

    def __post_init__(self) -> None:
        self.mode = GenerationMode(self.mode)
        if not self.storyboard:
            raise ValueError("a plan needs a prompt or a storyboard")
        self.storyboard = sorted(self.storyboard, key=lambda c: c.start_seconds)
        if self.storyboard[0].start_seconds > 0:
            raise ValueError("a storyboard must start at 0 seconds")

    # ------------------------------------------------------------------ prompts
    def add_change(self, start_seconds: float, prompt: str) -> None:
        """A prompt change made while the video is being generated (applies from the next chunk)."""
        if start_seconds < self.storyboard[-1].start_seconds:
            raise ValueError("prompt changes must come in time order")
        self.storyboard.append(PromptChange(start_seconds, prompt))

    def _entry_index(self, seconds: float) -> int:
        index = 0
        for i, change in enumerate(self.storyboard):
            if change.start_seconds <= seconds + 1e-9:
                index = i
        return index

    # ------------------------------------------------------------------ layout
    def _frames(self, latent_start: int, count: int) -> tuple[int, int]:
        """Video frames of generated latents, counted from the first generated frame."""
        start, end = frames_of_latents(latent_start, count, self.temporal_factor)
        offset = (
            frames_of_latents(0, self.prefix_latents, self.temporal_factor)[1] if self.prefix_latents else 0
        )
        return start - offset, end - offset

    def context_of(self, latent_start: int) -> list[int]:
        sinks = list(range(min(self.sink_frames, latent_start)))
        window = range(max(self.sink_frames, latent_start - self.window_frames), latent_start)
        return sinks + list(window)

    def chunks(self, num_frames: int | None = None) -> Iterator[PlannedChunk]:
        """Chunks until ``num_frames`` video frames exist (None: without end)."""
        diffusion_forcing = self.mode.staggered
        index = 0
        latent = self.prefix_latents
        frames_done = 0
        entry_at_change = self._entry_index(0.0)
        chunks_since_change = None  # None: no change yet
        while num_frames is None or frames_done < num_frames:
            count = self.chunk_frames
            frame_start, frame_end = self._frames(latent, count)
            start_time = max(0, frame_start) / self.fps
            entry = self._entry_index(start_time)
            actions: list[DriftAction] = []
            if entry != entry_at_change:
                chunks_since_change = 0
                previous = self.storyboard[entry_at_change].prompt
                entry_at_change = entry
                actions.append(DriftAction.REANCHOR)
                if self.recache_on_prompt_change and index > 0:
                    actions.append(DriftAction.RECACHE_PROMPT)
            elif chunks_since_change is not None:
                chunks_since_change += 1
            prompt = self.storyboard[entry].prompt
            in_transition = chunks_since_change is not None and chunks_since_change < self.transition_chunks
            settles = chunks_since_change is not None and chunks_since_change == self.transition_chunks
            if settles and self.recache_on_prompt_change and self.transition_chunks > 0:
                # the conditioning settles on the new prompt alone: the cache follows
                actions.append(DriftAction.RECACHE_PROMPT)
            if (
                self.recache_every
                and index > 0
                and index % self.recache_every == 0
                and DriftAction.RECACHE_PROMPT not in actions
            ):
                actions.append(DriftAction.RECACHE_PERIODIC)
            weight = 1.0
            if in_transition and chunks_since_change is not None:
                weight = (chunks_since_change + 1) / (self.transition_chunks + 1)
            yield PlannedChunk(
                index=index,
                latent_start=latent,
                latent_end=latent + count,
                frame_start=frame_start,
                frame_end=frame_end,
                start_time=start_time,
                prompt=prompt,
                previous_prompt=previous if in_transition else None,
                prompt_weight=weight,
                context=self.context_of(latent),
                sigmas=list(self.sigmas),
                actions=actions,
                first_iteration=index * self.ar_step if diffusion_forcing else 0,
            )
            index += 1
            latent += count
            frames_done = frame_end


@dataclass
class ChunkPlan:
    """A materialised plan (finite requests): what ``pipe.plan(...)`` returns."""

    chunks: list[PlannedChunk]
    num_frames: int
    fps: int
    height: int
    width: int
    mode: GenerationMode
    seed: int | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "num_frames": self.num_frames,
                "fps": self.fps,
                "height": self.height,
                "width": self.width,
                "mode": GenerationMode(self.mode).value,
                "seed": self.seed,
                "chunks": [c.to_dict() for c in self.chunks],
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> ChunkPlan:
        data = json.loads(text)
        chunks = []
        for c in data.pop("chunks"):
            c["actions"] = [DriftAction(a) for a in c["actions"]]
            chunks.append(PlannedChunk(**c))
        return cls(chunks=chunks, mode=GenerationMode(data.pop("mode")), **data)

    def summary(self) -> str:
        """One line per chunk: the video frames it makes (the last chunk's only up to the end),
        its start time, the earlier latent frames it sees, its prompt and its drift actions."""
        lines = [
            f"{len(self.chunks)} chunks, {self.num_frames} frames at {self.fps} fps, {self.width}x{self.height}"
        ]
        for c in self.chunks:
            prompt = (
                repr(c.prompt)
                if c.previous_prompt is None
                else f"{c.previous_prompt!r} -> {c.prompt!r} ({c.prompt_weight:.0%} new)"
            )
            acts = f"; {', '.join(a.value.replace('_', ' ') for a in c.actions)}" if c.actions else ""
            last = min(c.frame_end, self.num_frames) - 1
            lines.append(
                f"  chunk {c.index:4d}  frames {c.frame_start}-{last}  t={c.start_time:7.2f}s  "
                f"latents {c.latent_start}-{c.latent_end - 1}, {_sees(c.context)}  {prompt}{acts}"
            )
        return "\n".join(lines)


def _sees(context: list[int]) -> str:
    """``[0, 1, 6, 7, 8, 9]`` -> ``sees latents 0-1 and 6-9``; ``[]`` -> ``sees nothing earlier``."""
    if not context:
        return "sees nothing earlier"
    runs: list[list[int]] = []
    for frame in context:
        if runs and frame == runs[-1][1] + 1:
            runs[-1][1] = frame
        else:
            runs.append([frame, frame])
    parts = [f"{a}-{b}" if b > a else f"{a}" for a, b in runs]
    return "sees latents " + (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0])
