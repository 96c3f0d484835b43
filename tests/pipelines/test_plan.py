"""The chunk planner: layout, context, prompt changes and drift actions, against hand-made plans."""

import json

import pytest

from vidgen.pipelines.plan import (
    ChunkPlan,
    ChunkPlanner,
    DriftAction,
    GenerationMode,
    PromptChange,
    _sees,
)

REANCHOR, RECACHE, PERIODIC = DriftAction.REANCHOR, DriftAction.RECACHE_PROMPT, DriftAction.RECACHE_PERIODIC


def _planner(**kw) -> ChunkPlanner:
    """The default model's geometry: chunks of 2 latents, 2 sinks, a window of 4, 4x temporal, 16 fps."""
    args = dict(
        chunk_frames=2,
        sink_frames=2,
        window_frames=4,
        temporal_factor=4,
        fps=16,
        sigmas=[1.0, 0.5, 0.0],
        storyboard=[PromptChange(0.0, "a")],
    )
    args.update(kw)
    return ChunkPlanner(**args)


def _two_prompts(at: float = 1.0, **kw) -> ChunkPlanner:
    return _planner(storyboard=[PromptChange(0.0, "a"), PromptChange(at, "b")], **kw)


def test_layout_of_latents_frames_and_times():
    """Latent 0 decodes to frame 0, every later latent to 4 frames: chunk 0 makes frames 0-4,
    chunk i > 0 frames 5 + 8 (i - 1) .. + 7; the plan ends with the chunk that reaches num_frames."""
    chunks = list(_planner().chunks(13))
    assert [(c.index, c.latent_start, c.latent_end) for c in chunks] == [(0, 0, 2), (1, 2, 4)]
    assert [(c.frame_start, c.frame_end) for c in chunks] == [(0, 5), (5, 13)]
    assert [c.start_time for c in chunks] == [0.0, 5 / 16]
    assert len(list(_planner().chunks(14))) == 3  # one frame more: one chunk more
    assert len(list(_planner().chunks(1))) == 1
    assert all(c.sigmas == [1.0, 0.5, 0.0] and c.prompt == "a" for c in chunks)


def test_an_open_ended_plan_does_not_end():
    chunks = _planner().chunks(None)
    assert [next(chunks).index for _ in range(50)] == list(range(50))


def _brute_force_context(latent_start: int, sinks: int, window: int) -> list[int]:
    earlier = list(range(latent_start))
    kept_sinks = [f for f in earlier if f < sinks]
    rest = [f for f in earlier if f >= sinks]
    return kept_sinks + rest[max(0, len(rest) - window) :]


@pytest.mark.parametrize(("sinks", "window"), [(2, 4), (0, 3), (3, 0), (1, 1)])
def test_context_is_the_sinks_and_the_window_before_the_chunk(sinks, window):
    planner = _planner(sink_frames=sinks, window_frames=window)
    for latent_start in range(12):
        assert planner.context_of(latent_start) == _brute_force_context(latent_start, sinks, window)
    assert _planner().context_of(10) == [0, 1, 6, 7, 8, 9]


def test_a_prefilled_clip_shifts_latents_but_not_frames():
    """Three latents of a clip are in the cache (9 video frames): generation starts at latent 3,
    and its frames count from 0 again."""
    chunks = list(_planner(prefix_latents=3).chunks(16))
    assert [(c.latent_start, c.latent_end) for c in chunks] == [(3, 5), (5, 7)]
    assert [(c.frame_start, c.frame_end) for c in chunks] == [(0, 8), (8, 16)]
    assert [c.start_time for c in chunks] == [0.0, 0.5]
    assert chunks[0].context == [0, 1, 2]


def test_a_prompt_change_blends_over_the_transition_then_settles():
    """The change at 1 s lands on chunk 3 (t = 1.3125 s). With two transition chunks the new
    prompt weighs 1/3, 2/3, then 1; the cache is rebuilt when the change comes and when it settles."""
    chunks = list(_two_prompts(transition_chunks=2).chunks(70))
    assert [c.prompt for c in chunks[:7]] == ["a", "a", "a", "b", "b", "b", "b"]
    assert [c.previous_prompt for c in chunks[:7]] == [None, None, None, "a", "a", None, None]
    assert [c.prompt_weight for c in chunks[:7]] == pytest.approx([1, 1, 1, 1 / 3, 2 / 3, 1, 1])
    assert [c.actions for c in chunks[:7]] == [[], [], [], [REANCHOR, RECACHE], [], [RECACHE], []]
    assert all(c.actions == [] for c in chunks[7:])


def test_a_one_chunk_transition():
    chunks = list(_two_prompts(transition_chunks=1).chunks(70))
    assert [c.prompt_weight for c in chunks[2:6]] == pytest.approx([1, 1 / 2, 1, 1])
    assert [c.actions for c in chunks[2:6]] == [[], [REANCHOR, RECACHE], [RECACHE], []]


def test_a_prompt_change_without_transition_or_recache():
    sudden = list(_two_prompts(transition_chunks=0).chunks(70))
    assert [c.prompt_weight for c in sudden[:6]] == [1, 1, 1, 1, 1, 1]
    assert [c.previous_prompt for c in sudden[:6]] == [None] * 6
    assert [c.actions for c in sudden[:6]] == [[], [], [], [REANCHOR, RECACHE], [], []]
    kept = list(_two_prompts(transition_chunks=2, recache_on_prompt_change=False).chunks(70))
    assert [c.actions for c in kept[:7]] == [[], [], [], [REANCHOR], [], [], []]
    assert [c.prompt_weight for c in kept[:6]] == pytest.approx([1, 1, 1, 1 / 3, 2 / 3, 1])


def test_a_change_on_a_chunk_start_applies_to_that_chunk():
    # chunk 1 starts at frame 5 = 0.3125 s exactly, chunk 2 at 13 / 16 = 0.8125 s
    early = list(_two_prompts(at=5 / 16).chunks(13))
    assert [c.prompt for c in early] == ["a", "b"]
    assert early[1].actions == [REANCHOR, RECACHE]  # the first chunk after the start recaches too
    chunks = list(_two_prompts(at=13 / 16).chunks(30))
    assert [c.prompt for c in chunks] == ["a", "a", "b", "b", "b"]
    assert chunks[2].actions == [REANCHOR, RECACHE]
    # at 30 fps chunk 1 starts at 5 / 30 s; a change typed as 0.1666666667 is meant for it
    at_30 = _planner(fps=30, storyboard=[PromptChange(0.0, "a"), PromptChange(0.1666666667, "b")])
    assert [c.prompt for c in at_30.chunks(14)] == ["a", "b", "b"]


def test_storyboards_are_sorted_and_must_start_at_zero():
    planner = _planner(storyboard=[PromptChange(2.0, "c"), PromptChange(0.0, "a"), PromptChange(1.0, "b")])
    assert [c.prompt for c in planner.storyboard] == ["a", "b", "c"]
    with pytest.raises(ValueError, match="must start at 0 seconds"):
        _planner(storyboard=[PromptChange(0.5, "a")])
    with pytest.raises(ValueError, match="a prompt or a storyboard"):
        _planner(storyboard=[])


def test_a_change_made_while_the_video_plays_applies_from_the_next_chunk():
    planner = _planner()
    chunks = planner.chunks(None)
    first = [next(chunks) for _ in range(3)]
    planner.add_change(1.0, "b")  # chunk 3 starts at 1.3125 s
    later = [next(chunks) for _ in range(2)]
    assert [c.prompt for c in first + later] == ["a", "a", "a", "b", "b"]
    assert later[0].actions == [REANCHOR, RECACHE]
    planner.add_change(1.0, "c")  # the same moment again is in time order; the later change wins
    assert next(chunks).prompt == "c"
    with pytest.raises(ValueError, match="time order"):
        planner.add_change(0.5, "d")


def test_periodic_recache_every_n_chunks_unless_a_prompt_recache_is_due():
    chunks = list(_two_prompts(at=2.5, recache_every=3).chunks(100))
    periodic = [c.index for c in chunks if PERIODIC in c.actions]
    prompt = [c.index for c in chunks if RECACHE in c.actions]
    assert prompt == [6]  # t = 2.8125 s: also a multiple of 3, so no periodic recache there
    assert periodic == [3, 9, 12]
    assert not any(PERIODIC in c.actions for c in _planner().chunks(100))
    every = list(_planner(recache_every=1).chunks(40))
    assert [PERIODIC in c.actions for c in every] == [False] + [True] * (len(every) - 1)


def test_diffusion_forcing_staggers_the_chunks_by_ar_step():
    df = list(_planner(mode="diffusion_forcing", ar_step=3).chunks(40))
    assert df[0].first_iteration == 0 and [c.first_iteration for c in df] == [3 * i for i in range(len(df))]
    assert all(c.first_iteration == 0 for c in _planner(ar_step=3).chunks(40))
    default = _planner(mode="diffusion_forcing")
    assert default.mode is GenerationMode.DIFFUSION_FORCING
    assert [c.first_iteration for c in default.chunks(40)] == list(range(len(df)))  # ar_step 1


def test_a_plan_round_trips_through_json():
    chunks = list(_two_prompts(transition_chunks=2, recache_every=4).chunks(70))
    plan = ChunkPlan(chunks, 70, 16, 64, 96, GenerationMode.CHUNKWISE, seed=5)
    again = ChunkPlan.from_json(plan.to_json())
    assert again == plan
    assert again.chunks[3].actions == [REANCHOR, RECACHE]
    assert isinstance(again.chunks[3].actions[0], DriftAction)


def test_a_chunkwise_plan_saved_without_iterations_loads():
    """``first_iteration`` came with diffusion forcing: a chunk that lacks it starts at call 0."""
    plan = ChunkPlan(list(_planner().chunks(13)), 13, 16, 64, 64, GenerationMode.CHUNKWISE)
    data = json.loads(plan.to_json())
    for chunk in data["chunks"]:
        del chunk["first_iteration"]
    assert ChunkPlan.from_json(json.dumps(data)) == plan


def test_storyboard_entries_are_values():
    change = PromptChange(1.0, "b")
    assert change == PromptChange(1.0, "b") and hash(change) == hash(PromptChange(1.0, "b"))
    with pytest.raises(AttributeError):
        change.prompt = "c"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("context", "words"),
    [
        ([], "sees nothing earlier"),
        ([3], "sees latents 3"),
        ([0, 1, 6, 7, 8, 9], "sees latents 0-1 and 6-9"),
        ([0, 2, 4, 5], "sees latents 0, 2 and 4-5"),
    ],
)
def test_context_in_words(context, words):
    assert _sees(context) == words
