"""From chunks to stream segments: segment length and keyframes, continuity, pacing, stopping,
and the session freed however the stream ends."""

from __future__ import annotations

import threading
from fractions import Fraction

import numpy as np
import pytest

from tests.video.conftest import FLAT_TOLERANCE, flat_colour_clip, max_error, packets
from vidgen.pipelines import ChunkMetrics, InputError, VideoChunk
from vidgen.pipelines.drift import DriftMeasures
from vidgen.request import GenerationRequest
from vidgen.ui.live import LiveRecorder, Turns, live_stream
from vidgen.video import probe_video, read_video

FPS = 16
PROMPT = "a red circle moving left on a black background"


class FakeBackend:
    """A SessionBackend whose session yields ``clip`` in chunks of 8 frames (the first 5, as the
    pipeline's first chunk), recording what was asked of it."""

    def __init__(self, clip: np.ndarray, fail_at: int | None = None, made_ahead: bool = False) -> None:
        self.clip = clip
        self.fail_at = fail_at
        self.made_ahead = made_ahead  # chunks keep coming after stop, as from a backend that ran ahead
        self.stopped: list[str] = []
        self.made = 0
        self.open_sessions: set[str] = set()

    def open(self, request) -> str:
        self.open_sessions.add("s")
        return "s"

    def chunks(self, session_id):
        bounds = [0, 5, *range(13, len(self.clip), 8), len(self.clip)]
        try:
            for index, (a, b) in enumerate(zip(bounds, bounds[1:])):
                if session_id in self.stopped and not self.made_ahead:
                    return
                if index == self.fail_at:
                    raise InputError("the model cannot do that")
                self.made += 1
                drift = DriftMeasures(0.1 * index, 0.01, False, 0.5, index % 2 == 0)
                metrics = ChunkMetrics(0.01, 0.01, 0.02, (b - a) / FPS, 25.0, [], drift)
                yield VideoChunk(index, a, a / FPS, self.clip[a:b], PROMPT, metrics)
        finally:
            self.open_sessions.discard(session_id)

    def change_prompt(self, session_id, prompt):
        pass

    def stop(self, session_id):
        self.stopped.append(session_id)


def test_segments_are_whole_seconds_on_keyframes_with_continuous_time(tmp_path):
    clip = flat_colour_clip(45)
    backend = FakeBackend(clip)
    updates, seen = [], []
    for update in live_stream(backend, "s", tmp_path, FPS, max_lead=None, planned_seconds=45 / FPS):
        updates.append(update)
        if update.segment is not None:
            assert update.segment.is_file()  # still there while the consumer reads it
            seen.append((update.segment, update.segment.read_bytes()))
    assert [u.done for u in updates] == [False, False, True] and not updates[-1].stopped
    assert all(not path.exists() for path, _ in seen[:-1])  # taken, then deleted
    for k, (_, data) in enumerate(seen):
        (tmp_path / f"copy{k}.ts").write_bytes(data)
        info = probe_video(data)
        assert info["frames"] == (16 if k < 2 else 13) and info["fps"] == FPS
        times_keys = packets(tmp_path / f"copy{k}.ts")
        assert times_keys[0] == (Fraction(16 * k, FPS), True)  # opens on a keyframe, at its place
        assert not any(key for _, key in times_keys[1:])
    joined = b"".join(data for _, data in seen)
    frames, _ = read_video(joined)
    assert len(frames) == 45 and max_error(frames, clip) <= FLAT_TOLERANCE
    mp4, _ = read_video(updates[-1].video)
    assert updates[-1].video.name == "video.mp4" and len(mp4) == 45
    stats = updates[-1].stats
    assert stats.chunks == 6 and stats.frames == 45 and stats.video_seconds == 45 / FPS
    assert stats.frames_per_second > 0 and stats.real_time_factor == pytest.approx(
        stats.frames_per_second / FPS
    )
    assert [row for row in stats.drift if row[0] == 2] == [
        (2, "colour drift", 0.2),
        (2, "motion", 0.01),
    ] + [(2, "repetition", 0.5)]
    assert backend.open_sessions == set() and backend.stopped == ["s"]


def test_recorder_refuses_segments_under_a_second(tmp_path):
    with pytest.raises(ValueError, match="at least 1 s"):
        LiveRecorder(tmp_path, FPS, segment_seconds=0.5)


class FakeTime:
    """A clock and a stop switch whose waits advance the clock instead of sleeping."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waited = 0.0
        self._set = False

    def __call__(self) -> float:
        return self.now

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True

    def wait(self, timeout: float) -> bool:
        self.now += timeout
        self.waited += timeout
        return self._set


def test_generation_stays_within_the_lead_of_playback(tmp_path):
    fake = FakeTime()
    backend = FakeBackend(flat_colour_clip(16 * 8))
    leads = []
    streamed = 0
    for update in live_stream(backend, "s", tmp_path, FPS, max_lead=2.0, stop_event=fake, clock=fake):
        if update.segment is not None:
            streamed += 1
            leads.append(streamed - fake.now)  # playback starts with the first segment, at time 0
    # without pacing the fake clock would not move: the whole clip would be 8 s ahead; paced, the
    # last pull (which finds the end) happens when playback is within 2 s of the 8 s made
    assert fake.waited == pytest.approx(8 - 2, abs=0.3)
    assert max(leads) <= 2.0 + 1 + 1e-6  # at most the lead, plus the segment just completed


def test_stop_ends_within_one_chunk_and_frees_the_session(tiny_sessions, tmp_path):
    session_id = tiny_sessions.open(GenerationRequest(prompt=PROMPT, seed=0))  # until stopped
    stop = threading.Event()
    updates = []
    for update in live_stream(tiny_sessions, session_id, tmp_path, FPS, max_lead=None, stop_event=stop):
        updates.append(update)
        if len(updates) == 2:
            chunks_at_stop = update.stats.chunks
            stop.set()
    last = updates[-1]
    assert last.done and last.stopped and last.stats.chunks <= chunks_at_stop + 1
    assert len(read_video(last.video)[0]) == last.stats.frames
    assert tiny_sessions.active == 0  # generator closed, cache freed


def test_a_consumer_that_goes_away_stops_the_session_and_drops_the_mp4(tiny_sessions, tmp_path):
    session_id = tiny_sessions.open(GenerationRequest(prompt=PROMPT, seed=0))
    stream = live_stream(tiny_sessions, session_id, tmp_path, FPS, max_lead=None)
    first = next(stream)
    assert first.segment is not None and tiny_sessions.active == 1
    stream.close()  # what Gradio does when the browser disconnects
    assert tiny_sessions.active == 0
    assert not list(tmp_path.glob("*.mp4")) and not list(tmp_path.glob(".*mp4*"))


def test_an_error_in_generation_stops_the_session(tmp_path):
    backend = FakeBackend(flat_colour_clip(64), fail_at=3)
    stream = live_stream(backend, "s", tmp_path, FPS, max_lead=None)
    with pytest.raises(InputError, match="cannot do that"):
        list(stream)
    assert backend.stopped == ["s"] and backend.open_sessions == set() and backend.made == 3
    assert not list(tmp_path.glob("*.mp4"))


def test_stop_takes_no_chunk_a_remote_backend_made_ahead(tmp_path):
    backend = FakeBackend(flat_colour_clip(64), made_ahead=True)
    stop = threading.Event()
    updates = []
    for update in live_stream(backend, "s", tmp_path, FPS, max_lead=None, stop_event=stop):
        updates.append(update)
        stop.set()  # at the first segment, made of chunks 0-2
    assert updates[-1].stopped and updates[-1].stats.chunks == 3 and backend.made == 3
    assert len(read_video(updates[-1].video)[0]) == 21 and backend.open_sessions == set()


def test_turns_are_exclusive_and_first_come_first_served():
    turns = Turns(1)
    order, inside, most = [], [0], [0]
    lock = threading.Lock()

    def take(name: str) -> None:
        with turns.turn():
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            order.append(name)
            with lock:
                inside[0] -= 1

    with turns.turn():  # held: the others queue in the order they come
        threads = []
        for name in "abc":
            threads.append(threading.Thread(target=take, args=(name,)))
            threads[-1].start()
            while turns.waiting < len(threads):
                threading.Event().wait(0.005)
    for t in threads:
        t.join(timeout=10)
    assert order == ["a", "b", "c"] and most[0] == 1 and turns.waiting == 0


def test_a_stream_takes_one_turn_per_chunk_and_queues_behind_the_others(tmp_path):
    """Two streams on one slot take turns chunk by chunk: the one started second does not wait
    for the first (which could run until stopped) to end."""

    class Counted(Turns):
        taken = 0

        def turn(self):
            Counted.taken += 1
            return super().turn()

    turns = Counted(1)
    made: list[str] = []

    class Recording(FakeBackend):
        def chunks(self, session_id):
            for chunk in super().chunks(session_id):
                made.append(session_id)
                threading.Event().wait(0.02)  # a chunk takes a while, inside its turn
                yield chunk

    long, short = Recording(flat_colour_clip(16 * 8)), Recording(flat_colour_clip(16 * 2))
    runs = {
        sid: threading.Thread(
            target=lambda b=backend, sid=sid: list(
                live_stream(b, sid, tmp_path / sid, FPS, max_lead=None, turns=turns)
            )
        )
        for backend, sid in ((long, "a"), (short, "b"))
    }
    for sid, run in runs.items():
        (tmp_path / sid).mkdir()
        run.start()
        while not made:  # the second starts once the first is making chunks
            threading.Event().wait(0.005)
    for run in runs.values():
        run.join(timeout=30)
    assert made.count("a") == long.made == 17 and made.count("b") == short.made == 5
    assert made.index("b") <= 2, made  # within a chunk or two of asking
    last_b = len(made) - 1 - made[::-1].index("b")
    assert made[last_b + 1 :].count("a") >= 17 - 5 - 4, made  # the short one ended long before
    assert turns.taken == 17 + 5 + 2  # one turn per chunk, and one for each stream's last pull


def test_the_time_limit_ends_a_stream_as_stop_does(tmp_path):
    fake = FakeTime()
    backend = FakeBackend(flat_colour_clip(16 * 8))

    class Ticking(FakeTime):
        def __call__(self) -> float:
            self.now += 0.25  # every look at the clock: a quarter second later
            return self.now

    clock = Ticking()
    updates = list(
        live_stream(backend, "s", tmp_path, FPS, max_lead=None, stop_event=fake, clock=clock, time_limit=1.0)
    )
    last = updates[-1]
    assert last.done and last.stopped and last.time_up
    assert 0 < last.stats.chunks < 7 and "s" in backend.stopped
    assert len(read_video(last.video)[0]) == last.stats.frames
    from vidgen.ui.handlers import describe

    assert describe(last.stats, last).startswith("**Stopped at the server's time limit**")
    untimed = list(live_stream(FakeBackend(flat_colour_clip(16 * 8)), "s", tmp_path, FPS, max_lead=None))
    assert not untimed[-1].time_up and untimed[-1].stats.chunks == 17


def test_a_session_that_goes_back_leaves_the_frames_taken_back_out_of_the_download(tiny_sessions, tmp_path):
    """Mid-stream the session goes back: the chunks that follow start before the frames recorded,
    the figures count the branch, and the MP4 holds the branch's frames (those before the point
    gone back to, then the new ones), not the ones taken back."""
    session_id = tiny_sessions.open(GenerationRequest(prompt=PROMPT, seed=3))  # until stopped
    stop = threading.Event()
    stream = live_stream(
        tiny_sessions, session_id, tmp_path, FPS, max_lead=None, stop_event=stop, hold_seconds=4
    )
    updates, went_back, frames_before = [], None, 0
    for update in stream:
        updates.append(update)
        if went_back is None and update.stats.frames >= 3 * FPS:
            frames_before = update.stats.frames
            went_back = tiny_sessions.rewind(session_id, 1.5)
            assert went_back * FPS <= frames_before - 1.5 * FPS
        elif went_back is not None and update.stats.frames >= went_back * FPS + 2 * FPS:
            stop.set()
    last = updates[-1]
    assert last.done and went_back is not None
    frames = read_video(last.video)[0]
    assert len(frames) == last.stats.frames  # the branch: what came before the point, then the new frames
    made = sum(1 for u in updates if u.segment is not None)  # segments streamed, old branch included
    assert made * FPS > len(frames)  # the stream played the frames taken back; the download has not


def test_the_recorder_takes_back_only_what_it_still_holds(tmp_path):
    clip = flat_colour_clip(40)
    recorder = LiveRecorder(tmp_path, FPS, file_name="v.mp4", hold_seconds=1)  # 16 frames held
    recorder.add(clip[:32])  # 16 in the MP4, 16 held
    assert recorder.rewind(20) and recorder.frames == 20
    assert not recorder.rewind(10)  # frames 10-15 are in the MP4 already: they stay
    recorder.add(clip[:8])
    _, video = recorder.finish()
    assert len(read_video(video)[0]) == 16 + 8  # what reached the MP4 before, then the new frames
