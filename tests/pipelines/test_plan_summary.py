"""``ChunkPlan.summary``: frame ranges end with the video, context is said in words."""

from tests.pipelines.test_plan import _planner
from vidgen.pipelines.plan import ChunkPlan, PromptChange


def _plan(num_frames: int, storyboard=None) -> ChunkPlan:
    planner = _planner(storyboard=storyboard or [PromptChange(0.0, "a red circle")], transition_chunks=2)
    return ChunkPlan(list(planner.chunks(num_frames)), num_frames, 16, 64, 64, "chunkwise")


def test_the_last_chunk_ends_with_the_video():
    lines = _plan(320).summary().splitlines()
    assert lines[0] == "41 chunks, 320 frames at 16 fps, 64x64"
    # the last chunk decodes to frames 317-324, of which 317-319 are in the video
    assert "  chunk   40  frames 317-319 " in lines[-1]
    assert "324" not in lines[-1]


def test_context_in_words():
    lines = _plan(80).summary().splitlines()
    assert "latents 0-1, sees nothing earlier" in lines[1]
    assert "latents 2-3, sees latents 0-1 " in lines[2]
    assert "latents 8-9, sees latents 0-1 and 4-7 " in lines[5]  # sinks, then the window
    assert "[" not in "".join(lines[1:])


def test_prompt_transition_and_actions_in_words():
    plan = _plan(64, [PromptChange(0.0, "a red circle"), PromptChange(1.0, "a blue square")])
    changed = next(line for line in plan.summary().splitlines() if "->" in line)
    assert "'a red circle' -> 'a blue square' (33% new); reanchor, recache prompt" in changed
