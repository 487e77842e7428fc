"""In a real Chromium: a studio exposed as a Space runs it (`--host 0.0.0.0`), with a small
memory budget (LLDS_MEMORY_BUDGET_GB=1), offers the 3B and 7B checkpoints only as
unavailable, with the reason, and refuses a question to one of them before any load."""

from __future__ import annotations

import pytest

from agent.models import lookup
from agent.testing import free_port, start_process, stop_process
from tests.browser import ARTIFACTS, require_chromium

FLAGSHIP = "SEGAgentRL/LLDS-A-GRPO-Qwen2.5-3B-Base-MA"
pytestmark = [pytest.mark.browser, pytest.mark.slow]
require_chromium()


@pytest.fixture(scope="module")
def exposed_url():
    port = free_port()
    process = start_process(
        ["app.py", "--host", "0.0.0.0", "--port", str(port), "--no-warm-up"],
        f"http://127.0.0.1:{port}/", timeout=240,
        env={"HF_HUB_OFFLINE": "1", "LLDS_MODEL": "", "LLDS_MEMORY_BUDGET_GB": "1",
             "RETRIEVER_ENGINE": "bm25s", "GRADIO_SERVER_NAME": "", "PORT": ""})
    yield f"http://127.0.0.1:{port}/"
    stop_process(process)


def test_a_model_too_big_is_shown_unavailable_with_its_reason(browser, exposed_url):
    from playwright.sync_api import expect

    page = browser.new_context(viewport={"width": 1400, "height": 1100}).new_page()
    page.goto(exposed_url)
    page.locator("#ask-button").wait_for()
    page.locator("#ask-model input").click()
    options = page.get_by_role("option")
    expect(options.first).to_be_visible()
    flagship = options.filter(has_text=lookup(FLAGSHIP).label)
    expect(flagship).to_have_count(1)
    expect(flagship).to_contain_text("unavailable: needs 13.8 GB of RAM (3.09B parameters in "
                                     "float32), 1.0 GB available")
    nano = options.filter(has_text=lookup("nano").label)
    expect(nano).not_to_contain_text("unavailable")
    page.screenshot(path=str(ARTIFACTS / "hardware-picker.png"), full_page=True)
    flagship.click()
    expect(page.locator("#ask-model-info")).to_contain_text(
        "Unavailable on this machine: needs 13.8 GB of RAM")
    page.locator("#ask-question textarea").fill("Who painted the Mona Lisa?")
    page.locator("#ask-button").click()
    chat = page.locator("#ask-chat")
    expect(chat).to_contain_text("could not be loaded", timeout=30_000)
    expect(chat).to_contain_text("does not fit on this machine: needs 13.8 GB of RAM")
    page.context.close()
