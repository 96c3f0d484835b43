"""The page in a real browser (Debian's Chromium through Playwright): type, Generate, watch the
stream play, change the prompt mid-stream, Stop, download, and no error anywhere."""

from __future__ import annotations

import shutil
import time

import pytest

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
PROMPT = "a red circle moving left on a black background"
NEW_PROMPT = "a blue square moving up on a white background"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"needs {CHROMIUM} (apt-get install chromium)"),
]


def video_state(page) -> dict | None:
    return page.evaluate(
        """() => {
            const v = document.querySelector('#live-video video');
            return v ? {time: v.currentTime, paused: v.paused, error: v.error && v.error.message} : null;
        }"""
    )


def poll(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.25)


def test_generate_watch_change_prompt_stop(server, tmp_path):
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            console_errors = []
            page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: console_errors.append(str(e)))
            page.goto(server.url, timeout=60_000)
            page.wait_for_selector("#generate", timeout=60_000)

            page.locator("#prompt textarea").fill(PROMPT)
            page.get_by_label("Until stopped").check()
            page.click("#generate")

            # the stream plays: at least 2 s of it, without the player failing or restarting
            times = []

            def played_two_seconds():
                state = video_state(page)
                if state:
                    assert not state["error"], state
                    times.append(state["time"])
                return state and state["time"] >= 2.0

            poll(played_two_seconds, 40, "2 s of the stream to play")
            assert times == sorted(times), f"playback went backwards: {times}"

            page.locator("#new-prompt textarea").fill(NEW_PROMPT)
            page.click("#change-prompt")
            poll(
                lambda: (
                    (status := page.locator("#status").inner_text()).startswith("Streaming")
                    and NEW_PROMPT in status
                ),
                20,
                "chunks made with the new prompt",
            )
            page.screenshot(path=str(tmp_path / "streaming.png"), full_page=True)

            page.click("#stop")
            poll(lambda: "Stopped" in page.locator("#status").inner_text(), 20, "the stream to stop")
            link = page.locator("#download a").first
            link.wait_for(timeout=20_000)
            # named after the prompt, as vidgen render names its file
            assert link.get_attribute("href").endswith("a-red-circle-moving-left-on-a-black-background.mp4")
            assert int(page.locator("#chunks input").input_value()) > 0
            assert float(page.locator("#rtf input").input_value()) > 0
            state = video_state(page)
            assert state["time"] >= 2.0 and not state["error"]

            page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
            assert page.locator(".toast-body.error").count() == 0, page.locator(
                ".toast-body"
            ).all_inner_texts()
            assert "Error" not in page.locator("#status").inner_text()
            assert not console_errors, console_errors
        finally:
            browser.close()
    assert (tmp_path / "page.png").stat().st_size > 10_000


def test_a_form_error_is_one_message_in_the_status(server):
    """Before: a red "Error" on each of the six output panels and the status left at "Press
    Generate to start"."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            page.goto(server.url, timeout=60_000)
            page.wait_for_selector("#generate", timeout=60_000)
            assert "colour drift" in page.locator("#drift-legend").inner_text()
            page.locator("#prompt textarea").fill("   ")
            page.click("#generate")
            poll(lambda: "Check the form" in page.locator("#status").inner_text(), 20, "the message")
            assert "the prompt is empty" in page.locator("#status").inner_text()
            time.sleep(1)  # an error would have marked the panels by now
            assert page.get_by_text("Error", exact=True).count() == 0
            assert page.locator(".toast-body.error").count() == 0
        finally:
            browser.close()


def test_go_back_takes_the_last_seconds_out_of_the_video(server, tmp_path):
    """Generate until stopped, play 3 s, "Go back" 1 s with a new prompt: the status says where the
    video now stands and lists the branch's prompts; after Stop the download holds exactly the
    frames of the branch (as many as the status's seconds), not the ones taken back."""
    from vidgen.video import read_video

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            console_errors = []
            page.on("pageerror", lambda e: console_errors.append(str(e)))
            page.goto(server.url, timeout=60_000)
            page.wait_for_selector("#generate", timeout=60_000)
            page.locator("#prompt textarea").fill(PROMPT)
            page.get_by_label("Until stopped").check()
            page.click("#generate")
            poll(lambda: (s := video_state(page)) and s["time"] >= 3.0, 60, "3 s of the stream to play")

            page.locator("#back-seconds input").fill("1")
            page.locator("#new-prompt textarea").fill(NEW_PROMPT)
            page.click("#go-back")
            status = poll(
                lambda: "Went back to" in (text := page.locator("#status").inner_text()) and text,
                20,
                "the page to go back",
            )
            assert PROMPT in status and NEW_PROMPT in status  # the branch's prompts, in order
            went_back_to = float(status.split("Went back to")[1].split("s")[0])
            poll(
                lambda: (
                    (text := page.locator("#status").inner_text()).startswith("Streaming")
                    and NEW_PROMPT in text
                ),
                30,
                "chunks of the branch with the new prompt",
            )
            page.click("#stop")
            stopped = poll(
                lambda: "Stopped" in (text := page.locator("#status").inner_text()) and text,
                20,
                "the stream to stop",
            )
            seconds = float(stopped.split(":")[1].split("s of video")[0])
            link = page.locator("#download a").first
            link.wait_for(timeout=20_000)
            response = page.request.get(
                server.url.rstrip("/") + link.get_attribute("href")
                if link.get_attribute("href").startswith("/")
                else link.get_attribute("href")
            )
            assert response.ok
            (tmp_path / "branch.mp4").write_bytes(response.body())
            frames, fps = read_video(tmp_path / "branch.mp4")
            assert abs(len(frames) - seconds * fps) <= 1, (len(frames), seconds)
            assert seconds > went_back_to
            # every chunk made, the ones taken back too: the tiny model's first has 5 frames, the
            # others 8; going back 1 s took back at least 16 of them
            chunks = int(stopped.split(" in ")[1].split(" chunks")[0])
            assert len(frames) <= 8 * chunks - 3 - 16, (len(frames), chunks)
            assert not console_errors, console_errors
        finally:
            browser.close()
