"""LongVideoPipeline with a tiny random model: streaming, determinism, resume, continuation, errors."""

import json

import numpy as np
import pytest
import torch

from tests.tiny import FP32, save_tiny_pipeline, tiny_components
from vidgen.pipelines import ChunkPlan, InputError, LongVideoPipeline, ModelLoadError, StreamControl

PROMPT = "a red circle moving left on a black background"
BOARD = [(0.0, PROMPT), (1.0, "a blue square moving up on a white background")]


@pytest.fixture(scope="module")
def pipe():
    return tiny_components()


def _frames(chunks):
    return np.concatenate([c.frames for c in chunks])


def test_call_equals_stream_and_is_deterministic(pipe):
    out = pipe(PROMPT, seconds=2, generator=3)
    streamed = _frames(pipe.stream(PROMPT, seconds=2, generator=3))
    assert out.frames.shape == (32, 64, 64, 3) and out.frames.dtype == np.float32
    assert np.array_equal(out.frames, streamed.astype(np.float32) / 255.0)
    again = pipe(PROMPT, seconds=2, generator=3).frames
    assert np.array_equal(again, out.frames)
    other = pipe(PROMPT, seconds=2, generator=4).frames
    assert not np.array_equal(other, out.frames)


def test_output_types(pipe):
    pt = pipe(PROMPT, num_frames=9, generator=0, output_type="pt").frames
    assert pt.shape == (9, 3, 64, 64) and pt.dtype == torch.float32
    pil = pipe(PROMPT, num_frames=9, generator=0, output_type="pil").frames
    assert len(pil) == 9 and pil[0].size == (64, 64)
    latent = pipe(PROMPT, num_frames=9, generator=0, output_type="latent").frames
    assert latent.shape == (1, 4, 4, 16, 16)  # 9 frames -> 3 latent frames, rounded up to 2 chunks
    (frames,) = pipe(PROMPT, num_frames=9, generator=0, return_dict=False)
    assert np.array_equal(frames * 255, pt.permute(0, 2, 3, 1).numpy() * 255)


def test_chunks_carry_indices_times_and_metrics(pipe):
    chunks = list(pipe.stream(PROMPT, seconds=2, generator=0))
    assert [c.index for c in chunks] == list(range(len(chunks)))
    starts = [c.frame_start for c in chunks]
    assert starts[0] == 0 and all(b - a == len(c.frames) for a, b, c in zip(starts, starts[1:], chunks))
    assert sum(len(c.frames) for c in chunks) == 32
    assert all(c.frames.dtype == np.uint8 and c.frames.shape[1:] == (64, 64, 3) for c in chunks)
    m = chunks[-1].metrics
    assert m.total_seconds > 0 and m.real_time_factor > 0 and m.drift is not None


def test_plan_is_serialisable_and_follows_the_storyboard(pipe):
    plan = pipe.plan(storyboard=BOARD, seconds=3)
    again = ChunkPlan.from_json(plan.to_json())
    assert again.to_json() == plan.to_json()
    assert plan.chunks[-1].frame_end >= 48
    changed = [c for c in plan.chunks if c.start_time >= 1.0]
    first = changed[0]
    assert first.prompt == BOARD[1][1] and first.previous_prompt == PROMPT
    assert [a.value for a in first.actions] == ["reanchor", "recache_prompt"]
    assert all(c.prompt == PROMPT for c in plan.chunks if c.start_time < 1.0)
    # the context: the two sink frames and a window of four
    assert plan.chunks[4].context == [0, 1, 4, 5, 6, 7]
    json.loads(plan.to_json())


def test_storyboard_video_changes_prompt(pipe):
    chunks = list(pipe.stream(storyboard=BOARD, seconds=3, generator=1))
    assert chunks[0].prompt == PROMPT and chunks[-1].prompt == BOARD[1][1]
    assert any("recache_prompt" in c.metrics.actions for c in chunks)


def test_resume_after_interruption_gives_identical_frames(pipe, tmp_path):
    state = tmp_path / "state.safetensors"
    full = _frames(pipe.stream(storyboard=BOARD, seconds=3, generator=5))
    stream = pipe.stream(storyboard=BOARD, seconds=3, generator=5, state_path=state)
    first = [next(stream) for _ in range(3)]
    stream.close()  # killed while holding chunk 2: its state was not saved yet
    rest = list(pipe.stream(storyboard=BOARD, seconds=3, generator=5, state_path=state, resume=True))
    assert rest[0].index == 2
    assert np.array_equal(rest[0].frames, first[2].frames)
    assert np.array_equal(_frames(first[:2] + rest), full)


def test_continuation_prefills_the_clip(pipe):
    clip = (np.random.default_rng(0).random((9, 64, 64, 3)) * 255).astype(np.uint8)
    other = np.zeros_like(clip)
    a = pipe(PROMPT, num_frames=16, generator=0, video=clip).frames
    b = pipe(PROMPT, num_frames=16, generator=0, video=other).frames
    plain = pipe(PROMPT, num_frames=16, generator=0).frames
    assert a.shape == (16, 64, 64, 3)
    assert not np.array_equal(a, b) and not np.array_equal(a, plain)
    single = pipe(PROMPT, num_frames=8, generator=0, image=clip[0]).frames
    assert single.shape == (8, 64, 64, 3)


def test_diffusion_forcing_with_one_chunk_in_flight_equals_chunkwise():
    chunkwise = tiny_components()
    forcing = tiny_components(**{"generation.mode": "diffusion_forcing", "generation.ar_step": 4})
    a = chunkwise(PROMPT, seconds=2, generator=0).frames
    b = forcing(PROMPT, seconds=2, generator=0).frames
    assert np.array_equal(a, b)


def test_diffusion_forcing_pipelines_several_chunks():
    forcing = tiny_components(**{"generation.mode": "diffusion_forcing", "generation.ar_step": 1})
    a = forcing(PROMPT, seconds=2, generator=0).frames
    assert a.shape == (32, 64, 64, 3)
    assert np.array_equal(a, forcing(PROMPT, seconds=2, generator=0).frames)
    assert not np.array_equal(a, tiny_components()(PROMPT, seconds=2, generator=0).frames)


def test_guidance_runs_both_branches(pipe):
    guided = pipe(PROMPT, seconds=1, generator=0, guidance_scale=3.0).frames
    plain = pipe(PROMPT, seconds=1, generator=0).frames
    assert guided.shape == plain.shape and not np.array_equal(guided, plain)


def test_stream_control_changes_prompt_and_stops(pipe):
    control = StreamControl()
    seen = []
    for chunk in pipe.stream(PROMPT, generator=0, control=control):  # no length: until stopped
        seen.append(chunk)
        if chunk.index == 1:
            control.change_prompt("a green triangle moving down on a gray background")
        if chunk.index == 4:
            control.stop()
    assert len(seen) == 5
    assert seen[1].prompt == PROMPT and seen[2].prompt.startswith("a green triangle")


def test_save_and_load_round_trip(tmp_path):
    folder = save_tiny_pipeline(tmp_path / "tiny")
    loaded = LongVideoPipeline.from_pretrained(folder)
    original = tiny_components()
    assert np.array_equal(
        loaded(PROMPT, seconds=1, generator=2).frames, original(PROMPT, seconds=1, generator=2).frames
    )


def test_weights_holding_nan_are_refused_at_load(tmp_path):
    """A transformer or LoRA whose weights hold NaN (issue 54: it made a silently wrong video)."""
    from safetensors.torch import load_file, save_file

    folder = save_tiny_pipeline(tmp_path / "tiny")
    weights = next((folder / "transformer").glob("*.safetensors"))
    state = load_file(weights)
    state["blocks.1.ffn.net.2.weight"][0, 0] = float("nan")
    save_file(state, weights)
    with pytest.raises(ModelLoadError, match=r"NaN or infinite values \(in blocks.1.ffn.net.2.weight\)"):
        LongVideoPipeline.from_pretrained(folder)
    lora = {"transformer.blocks.0.attn1.to_q.lora_A.weight": torch.full((4, 32), float("inf")),
            "transformer.blocks.0.attn1.to_q.lora_B.weight": torch.zeros(32, 4)}  # fmt: skip
    save_file(lora, tmp_path / "lora.safetensors")
    pipe = tiny_components()
    with pytest.raises(ModelLoadError, match="the LoRA .*lora.safetensors holds NaN or infinite"):
        pipe.load_lora_weights(tmp_path / "lora.safetensors")


def test_missing_and_corrupt_weights_name_the_path(tmp_path):
    with pytest.raises(ModelLoadError, match="no model folder at .*nowhere"):
        LongVideoPipeline.from_pretrained(tmp_path / "nowhere")
    folder = save_tiny_pipeline(tmp_path / "tiny")
    weights = next((folder / "transformer").glob("*.safetensors"))
    weights.write_bytes(b"garbage")
    with pytest.raises(ModelLoadError, match="transformer"):
        LongVideoPipeline.from_pretrained(folder)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompt": "  ", "seconds": 1}, "empty"),
        ({"prompt": PROMPT, "seconds": -1}, "seconds must be a positive number, got -1"),
        ({"prompt": PROMPT, "seconds": 1e9}, "video length|max_seconds"),
        ({"prompt": PROMPT, "seconds": 1, "height": 50}, "multiples of 8"),
        ({"storyboard": [(0, PROMPT), (0, PROMPT)], "seconds": 1}, "increase"),
        ({"storyboard": [(1, PROMPT)], "seconds": 1}, "starts at 0"),
        ({"prompt": PROMPT, "storyboard": BOARD, "seconds": 1}, "exactly one"),
    ],
)
def test_bad_requests_raise_clear_errors(pipe, kwargs, message):
    with pytest.raises(InputError, match=message):
        pipe(**kwargs)


NAN = float("nan")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_frames": 2.5}, "num_frames must be an integer, got 2.5"),
        ({"num_frames": True}, "num_frames must be an integer, got bool"),
        ({"seconds": NAN}, "seconds must be a finite number, got nan"),
        ({"seconds": float("inf")}, "seconds must be a finite number"),
        ({"seconds": 1e308}, r"seconds must be at most 3600 \(generation.max_seconds\)"),
        ({"seconds": 1, "guidance_scale": NAN}, "guidance_scale must be a finite number"),
        ({"seconds": 1, "guidance_scale": 0}, "guidance_scale must be a positive number"),
        ({"seconds": 1, "guidance_scale": 1e308}, "guidance_scale must be at most 100"),
        ({"seconds": 1, "generator": "abc"}, "generator must be a torch.Generator or an int seed, got str"),
        ({"seconds": 1, "generator": 2**64}, "generator must be at most"),
        ({"seconds": 1, "generator": -1}, "generator must be at least 0"),
        ({"seconds": 1, "num_inference_steps": 0}, "num_inference_steps must be a positive integer"),
        ({"seconds": 1, "num_inference_steps": 100_000}, r"at most 1000 \(generation.max_steps\)"),
        ({"seconds": 1, "height": 0}, "height must be a positive integer, got 0"),
        ({"seconds": 1, "image": np.full((64, 64, 3), NAN)}, "image= must hold finite numbers"),
        ({"seconds": 1, "negative_prompt": "caf\udce9"}, "negative_prompt is not valid UTF-8"),
    ],
)
def test_bad_arguments_raise_one_error_type_naming_the_argument(pipe, kwargs, message):
    """One documented type (vidgen.InputError, a ValueError) for every bad argument, before any work."""
    import vidgen

    with pytest.raises(vidgen.InputError, match=message) as err:
        pipe(PROMPT, **kwargs)
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    "storyboard, message",
    [
        ([], "non-empty list"),
        ("a string", "non-empty list"),
        ([(0, PROMPT), (NAN, PROMPT)], "storyboard entry 1 start must be a finite number"),
        ([(False, PROMPT)], "storyboard entry 0 start must be a number, got bool"),
        ([(0, PROMPT), (1e308, PROMPT)], "entry 1 starts at 1e\\+308 s, after the longest video"),
        ([(0, PROMPT, 3)], r"entry 0 must be \(start_seconds, prompt\)"),
        ([(0, 7)], "storyboard entry 0 prompt must be a string"),
    ],
)
def test_bad_storyboards(pipe, storyboard, message):
    with pytest.raises(InputError, match=message):
        pipe(storyboard=storyboard, seconds=1)


def test_memory_estimate_refuses_what_cannot_fit(pipe):
    from vidgen.pipelines.budget import estimate_memory

    small = estimate_memory(pipe, pipe.config, 64, 64, 1.0)
    big = estimate_memory(pipe, pipe.config, 128, 128, 1.0)
    assert big.total == pytest.approx(4 * small.total, rel=0.01)  # every term grows with the pixels
    guided = estimate_memory(pipe, pipe.config, 64, 64, 5.0)
    assert guided.kv_cache == 2 * small.kv_cache  # two branches, two caches
    half = {"runtime.max_memory_gb": small.total / 2e9}
    with pytest.raises(InputError, match=r"a 64x64 video needs about .* GB .*runtime.max_memory_gb"):
        next(pipe.stream(PROMPT, seconds=1, overrides=half))
    pipe.plan(PROMPT, seconds=1)  # the default limit (available memory) lets a small video through


def test_state_path_that_is_a_directory_is_refused(pipe, tmp_path):
    with pytest.raises(InputError, match="is not a file .* give a file path"):
        next(pipe.stream(PROMPT, seconds=1, generator=0, state_path=tmp_path))
    assert list(tmp_path.parent.glob(tmp_path.name + ".tmp")) == []


def test_call_needs_a_length(pipe):
    with pytest.raises(InputError, match="num_frames"):
        pipe(PROMPT)
    with pytest.raises(InputError, match="output_type"):
        pipe(PROMPT, seconds=1, output_type="gif")


def test_steps_and_overrides_apply_to_one_video_only(pipe):
    two = pipe(PROMPT, seconds=1, generator=0, num_inference_steps=2).frames
    four = pipe(PROMPT, seconds=1, generator=0).frames
    assert not np.array_equal(two, four)
    windowed = pipe(PROMPT, seconds=2, generator=0, overrides={"generation.window_frames": 2}).frames
    assert not np.array_equal(windowed, pipe(PROMPT, seconds=2, generator=0).frames)
    assert pipe.config.generation.window_frames == 4


@pytest.mark.slow
def test_compiled_blocks_give_the_same_video():
    eager = tiny_components(**{"runtime.autocast": "off"})
    compiled = tiny_components(**{"runtime.autocast": "off"})
    compiled.compile()
    a = eager(PROMPT, seconds=2, generator=0, output_type="latent").frames
    b = compiled(PROMPT, seconds=2, generator=0, output_type="latent").frames
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def _replanned(monkeypatch, change):
    """Every chunk the planner lays out (for the chunk loop and the read-ahead alike) passes ``change``."""
    from vidgen.pipelines.plan import ChunkPlanner

    original = ChunkPlanner.chunks

    def chunks(self, num_frames=None):
        for chunk in original(self, num_frames):
            change(chunk)
            yield chunk

    monkeypatch.setattr(ChunkPlanner, "chunks", chunks)


def test_the_executor_runs_the_planned_noise_levels(monkeypatch):
    pipe = tiny_components(**FP32)
    two_steps = pipe(PROMPT, seconds=1, generator=0, num_inference_steps=2, output_type="latent").frames
    four_steps = pipe(PROMPT, seconds=1, generator=0, output_type="latent").frames
    levels = pipe.plan(PROMPT, seconds=1, num_inference_steps=2).chunks[0].sigmas
    _replanned(monkeypatch, lambda chunk: setattr(chunk, "sigmas", list(levels)))
    replanned = pipe(PROMPT, seconds=1, generator=0, output_type="latent").frames  # 4 steps configured
    assert torch.equal(replanned, two_steps) and not torch.equal(replanned, four_steps)


def test_diffusion_forcing_runs_the_planned_stagger(monkeypatch):
    df = {**FP32, "generation.mode": "diffusion_forcing"}
    staggered = tiny_components(**df, **{"generation.ar_step": 2})
    expected = staggered(PROMPT, seconds=2, generator=0, output_type="latent").frames
    lockstep = tiny_components(**df, **{"generation.ar_step": 1})
    other = lockstep(PROMPT, seconds=2, generator=0, output_type="latent").frames
    # the plan of ar_step=2 given to a pipeline configured with ar_step=1
    _replanned(monkeypatch, lambda chunk: setattr(chunk, "first_iteration", 2 * chunk.index))
    got = lockstep(PROMPT, seconds=2, generator=0, output_type="latent").frames
    assert torch.equal(got, expected) and not torch.equal(got, other)


@pytest.mark.parametrize("ar_step", [1, 2])
def test_diffusion_forcing_resumes_with_identical_frames(tmp_path, ar_step):
    pipe = tiny_components(**{**FP32, "generation.mode": "diffusion_forcing", "generation.ar_step": ar_step})
    state = tmp_path / "state.safetensors"
    full = _frames(pipe.stream(storyboard=BOARD, seconds=3, generator=5))
    stream = pipe.stream(storyboard=BOARD, seconds=3, generator=5, state_path=state)
    first = [next(stream) for _ in range(3)]
    stream.close()
    rest = list(pipe.stream(storyboard=BOARD, seconds=3, generator=5, state_path=state, resume=True))
    assert rest[0].index == 2
    assert np.array_equal(_frames(first[:2] + rest), full)


def test_checking_an_hour_long_request_lays_out_no_chunk(pipe, monkeypatch):
    from vidgen.pipelines.plan import ChunkPlanner

    def no_layout(self, num_frames=None):
        raise AssertionError("check_inputs laid out chunks")

    monkeypatch.setattr(ChunkPlanner, "chunks", no_layout)
    planner = pipe.check_inputs(storyboard=BOARD, seconds=3600, seed=1)
    assert planner.storyboard[1].prompt == BOARD[1][1]
    with pytest.raises(InputError, match="seconds must be at most"):
        pipe.check_inputs(PROMPT, seconds=3601)
    with pytest.raises(InputError, match="storyboard times must increase"):
        pipe.check_inputs(storyboard=BOARD[::-1], seconds=3600)
    with pytest.raises(AssertionError, match="laid out"):
        pipe.plan(PROMPT, seconds=3600)  # the materialised plan does lay them out


def test_the_cache_rebuilt_on_resume_is_the_cache_of_the_run(tmp_path):
    """Resume rebuilds the cache from the saved latents; it must be, bit for bit, the one the
    uninterrupted run holds (its context is always written by that same cache pass)."""
    from vidgen.pipelines.run import VideoRun

    pipe = tiny_components(**FP32, **{"generation.guidance_scale": 2.0})
    g = pipe.config.generation
    changes, _ = pipe._check_request(None, BOARD, None, 3, g.fps)

    def new_run():
        planner = pipe._planner(pipe.config, changes, g.num_inference_steps)
        return VideoRun(pipe, pipe.config, planner, 16, 16, 2.0, seed=5, steps=g.num_inference_steps)

    run = new_run()
    for chunk in run.planner.chunks(16 * 2):  # 2 s: past the window (frames leave it from chunk 3)
        run.make_chunk(chunk, "", None)
    assert sorted(run.cache.cached_frames) == [0, 1, 6, 7, 8, 9]
    run.save(tmp_path / "state.safetensors", chunk.index)
    resumed = new_run()
    assert resumed.load(tmp_path / "state.safetensors", "") == chunk.index
    assert resumed.cache.slot_frames == run.cache.slot_frames
    assert torch.equal(resumed.cache.k, run.cache.k) and torch.equal(resumed.cache.v, run.cache.v)
    # the history is what determines it: a changed latent changes the rebuilt cache
    resumed.history[max(resumed.history)] += 0.1
    resumed.rebuild_cache(chunk, pipe._conditioning(chunk, 2.0, ""), full=True)
    assert not torch.equal(resumed.cache.k, run.cache.k)


def test_a_window_chunk_is_written_once_and_sees_only_the_sinks(monkeypatch):
    """After the first chunk each chunk costs one cache write, of itself; and a window chunk's keys
    do not depend on the other window chunks (only on the sinks and its own latents)."""
    from vidgen.pipelines.denoiser import ChunkDenoiser
    from vidgen.pipelines.run import VideoRun

    pipe = tiny_components(**FP32)
    g = pipe.config.generation
    changes, _ = pipe._check_request(PROMPT, None, None, 3, g.fps)
    planner = pipe._planner(pipe.config, changes, g.num_inference_steps)
    run = VideoRun(pipe, pipe.config, planner, 16, 16, 1.0, seed=5, steps=g.num_inference_steps)
    writes: list[int] = []
    original = ChunkDenoiser.write_context
    monkeypatch.setattr(
        ChunkDenoiser,
        "write_context",
        lambda self, x, c, cache, first, gen=None: (
            writes.append(first) or original(self, x, c, cache, first, gen)
        ),
    )
    for chunk in run.planner.chunks(16 * 2):
        before = len(writes)
        run.make_chunk(chunk, "", None)
        assert writes[before:] == [chunk.latent_start]  # the chunk itself, nothing rewritten
    assert sorted(run.cache.cached_frames) == [0, 1, 6, 7, 8, 9]
    newest = [run.cache.slot_of(f) for f in (8, 9)]
    tokens = [s * run.cache.frame_tokens + i for s in newest for i in range(run.cache.frame_tokens)]
    keys = run.cache.k[:, :, tokens].clone()
    run.history[6] = run.history[6] + 1.0  # another window chunk's latents change ...
    run.rebuild_cache(chunk, pipe._conditioning(chunk, 1.0, ""), full=True)
    torch.testing.assert_close(run.cache.k[:, :, tokens], keys, rtol=0, atol=0)  # ... not the newest's keys
    run.history[0] = run.history[0] + 1.0  # a sink's do
    run.rebuild_cache(chunk, pipe._conditioning(chunk, 1.0, ""), full=True)
    assert not torch.equal(run.cache.k[:, :, tokens], keys)


def test_a_state_saved_by_an_older_version_is_refused(pipe, tmp_path):
    from vidgen.models import KVCache

    state = tmp_path / "state.safetensors"
    cache = KVCache(
        num_layers=2, batch_size=1, num_heads=2, head_dim=16, frame_tokens=64, sink_frames=2, window_frames=4
    )
    cache.save(state, extra={"chunk_index": torch.tensor([1]), "seed": torch.tensor([0])})
    with pytest.raises(InputError, match="not a generation state this vidgen can resume"):
        next(pipe.stream(PROMPT, seconds=2, generator=0, state_path=state, resume=True))
    other = tmp_path / "other.safetensors"
    list(pipe.stream(PROMPT, seconds=1, generator=0, state_path=other))
    with pytest.raises(InputError, match=r"saved with different settings \(window_frames 4 \(now 2\)\)"):
        next(
            pipe.stream(
                PROMPT, seconds=2, generator=0, state_path=other, resume=True,
                overrides={"generation.window_frames": 2},
            )
        )  # fmt: skip


def test_a_state_path_is_only_a_vidgen_state(pipe, tmp_path):
    """``state_path`` never overwrites or reads someone's other file: a file that is not a vidgen
    state (with ``resume`` or without), a device node, or a path in a missing folder is refused
    before the first chunk, and the file is left as it was."""
    other = tmp_path / "notes.txt"
    other.write_text("my notes")
    for resume in (False, True):
        with pytest.raises(InputError, match="not a (whole |vidgen )?generation state"):
            next(pipe.stream(PROMPT, seconds=1, generator=0, state_path=other, resume=resume))
    assert other.read_text() == "my notes"
    with pytest.raises(InputError, match="is not a file"):
        next(pipe.stream(PROMPT, seconds=1, generator=0, state_path="/dev/null"))
    with pytest.raises(InputError, match="its folder does not exist"):
        next(pipe.stream(PROMPT, seconds=1, generator=0, state_path=tmp_path / "missing" / "s.safetensors"))
    # a state this vidgen wrote is taken up, and one damaged after it was written is refused
    state = tmp_path / "state.safetensors"
    first = [c.frames for c in pipe.stream(PROMPT, seconds=1, generator=0, state_path=state)]
    data = bytearray(state.read_bytes())
    data[-1] ^= 1
    state.write_bytes(bytes(data))
    with pytest.raises(InputError, match="damaged"):
        next(pipe.stream(PROMPT, seconds=2, generator=0, state_path=state, resume=True))
    assert first


def test_steering_arguments_of_the_wrong_kind_are_input_errors(pipe):
    """A user error through the API is an InputError naming the argument: ``change_prompt(123)``
    used to raise AttributeError when the stream reached it, a ``control=`` of another type inside
    the pipeline."""
    control = StreamControl()
    for bad in (123, None, "\u200b "):
        with pytest.raises(InputError, match="change_prompt's prompt"):
            control.change_prompt(bad)
    assert control.take_prompt() is None  # nothing was queued
    with pytest.raises(InputError, match="control= must be a StreamControl, got str"):
        next(pipe.stream(PROMPT, seconds=1, generator=0, control="stop"))
