"""The chat page in a real headless browser (Debian's chromium + chromedriver, Selenium)
against a real ``pace serve --api-key`` process: an answer streams in with its TTFT and
tokens/s, Stop ends a long answer, a bad schema is an error in the page.

Needs ``make setup-browser``; skipped (with the reason) without it. Set PACE_CHAT_SCREENSHOT
to a path to keep the screenshot of a conversation there (docs/images/chat-page.png)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if importlib.util.find_spec("selenium") is None or not (CHROMIUM and CHROMEDRIVER):
    pytest.skip(
        "the browser test needs Selenium, chromium and chromedriver: run `make setup-browser`",
        allow_module_level=True,
    )

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

API_KEY = "browser-test-key"
START_TIMEOUT_S = 300.0
ANSWER_TIMEOUT_S = 120.0
OPTIONAL_PROPERTY_SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server_url(smollm2_dir, tmp_path_factory):
    """A ``pace serve`` process with an API key on a free port; its log on failure."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("pace-serve") / "serve.log"
    command = [sys.executable, "-m", "pace_core.cli", "serve", str(smollm2_dir)]
    command += ["--port", str(port), "--threads", "1", "--api-key", API_KEY]
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"pace serve did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _healthy(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url + "/health", timeout=2).status_code == 200
    return False


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,860")
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


def requests_running(url: str) -> float | None:
    """The server's ``pace_num_requests_running`` (Stop cancels the request there too)."""
    metrics = httpx.get(url + "/metrics", timeout=10).text
    samples = [
        line for line in metrics.splitlines() if line.startswith("pace_num_requests_running")
    ]
    return sum(float(line.rsplit(" ", 1)[1]) for line in samples) if samples else None


class ChatPage:
    """The page as a user drives it: fields by their ids, waits on what the page shows."""

    def __init__(self, driver, url: str) -> None:
        self.driver = driver
        driver.get(url + "/")
        self.wait = WebDriverWait(driver, ANSWER_TIMEOUT_S)
        self.field("api-key").send_keys(API_KEY, Keys.TAB)  # "change": the models reload
        self.wait.until(lambda _: self.field("model").get_attribute("value"))
        self.wait.until(lambda _: not self.error())

    def field(self, element_id: str):
        return self.driver.find_element(By.ID, element_id)

    def set(self, element_id: str, value: str) -> None:
        """Set a text field as typing would (the page reads the value when it sends)."""
        self.driver.execute_script(
            "arguments[0].value = arguments[1]", self.field(element_id), value
        )

    def ask(self, prompt: str) -> None:
        self.field("prompt").send_keys(prompt, Keys.ENTER)

    def error(self) -> str:
        error = self.field("error")
        return "" if error.get_attribute("hidden") is not None else error.text

    def answers(self) -> list:
        return self.driver.find_elements(By.CSS_SELECTOR, ".message.assistant")

    def last_answer_text(self) -> str:
        return self.answers()[-1].find_element(By.CLASS_NAME, "content").text

    def last_stats(self) -> str:
        return self.answers()[-1].find_element(By.CLASS_NAME, "stats").text

    def ready(self) -> bool:
        """Idle again: Send enabled, Stop disabled."""
        return self.field("send").is_enabled() and not self.field("stop").is_enabled()

    def wait_ready(self) -> None:
        self.wait.until(lambda _: self.ready())


def test_answer_streams_with_ttft_and_tokens_per_second(browser, server_url):
    page = ChatPage(browser, server_url)
    page.set("temperature", "0")
    page.set("max-tokens", "40")
    page.set("system-prompt", "You are a concise assistant.")
    page.ask("What is the capital of France?")
    page.wait.until(lambda _: page.last_answer_text())  # text appears while it streams
    page.wait_ready()
    assert page.last_answer_text().strip()
    stats = page.last_stats()
    assert "TTFT" in stats and "tokens/s" in stats, stats
    assert not page.error()

    page.ask("And of Italy?")  # a second turn: the conversation is kept
    page.wait.until(lambda _: len(page.answers()) == 2 and page.last_answer_text())
    page.wait_ready()
    assert len(browser.find_elements(By.CSS_SELECTOR, ".message.user")) == 2
    assert "TTFT" in page.last_stats()
    script_problems = [
        entry["message"]
        for entry in browser.get_log("browser")
        if "Content Security Policy" in entry["message"] or "Uncaught" in entry["message"]
    ]
    assert not script_problems
    screenshot = os.environ.get("PACE_CHAT_SCREENSHOT")
    if screenshot:
        Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(screenshot)


def test_stop_ends_a_long_answer(browser, server_url):
    page = ChatPage(browser, server_url)
    page.set("temperature", "0")
    page.set("max-tokens", "4000")
    page.ask("Count from 1 to 3000, one number per line.")
    page.wait.until(lambda _: len(page.last_answer_text()) > 20)
    assert not page.ready()  # still streaming
    page.field("stop").click()
    page.wait_ready()
    assert "stopped" in page.last_stats()
    stopped_at = page.last_answer_text()
    time.sleep(1.0)
    assert page.last_answer_text() == stopped_at  # nothing arrives after Stop
    assert not page.error()
    WebDriverWait(browser, 30).until(lambda _: requests_running(server_url) == 0)

    page.set("max-tokens", "8")
    page.ask("Thanks!")  # ready for the next turn
    page.wait.until(lambda _: len(page.answers()) == 2 and page.last_answer_text())
    page.wait_ready()
    assert not page.error()


def test_tool_calls_are_shown(browser, server_url):
    page = ChatPage(browser, server_url)
    page.set("temperature", "0")
    page.set("max-tokens", "120")
    page.set("tools", json.dumps([WEATHER_TOOL]))
    Select(page.field("tool-choice")).select_by_value("required")
    page.ask("What is the weather in Paris?")
    page.wait.until(lambda _: page.answers() and page.ready())
    assert not page.error()
    calls = page.answers()[-1].find_elements(By.CLASS_NAME, "tool-call")
    assert calls and calls[0].text.startswith("tool call: get_weather("), page.last_stats()


def test_schema_that_is_not_json_is_an_error_before_sending(browser, server_url):
    page = ChatPage(browser, server_url)
    page.set("json-schema", '{"type": "object",')
    page.ask("Hello")
    page.wait.until(lambda _: page.error())
    assert "not valid JSON" in page.error()
    assert page.answers() == [] and page.field("prompt").get_attribute("value") == "Hello"


def test_schema_the_server_rejects_is_shown(browser, server_url):
    page = ChatPage(browser, server_url)
    page.set("json-schema", json.dumps(OPTIONAL_PROPERTY_SCHEMA))
    page.field("strict").click()
    page.ask("Hello")
    page.wait.until(lambda _: page.error())
    page.wait_ready()
    assert "Server error 400" in page.error(), page.error()
    # the turn is taken back: nothing in the conversation, the question back in the input
    assert page.answers() == [] and page.field("prompt").get_attribute("value") == "Hello"

    page.field("strict").click()  # not strict: the same schema is accepted
    page.set("max-tokens", "60")
    page.field("prompt").send_keys(Keys.ENTER)
    page.wait.until(lambda _: page.answers() and page.last_answer_text())
    page.wait_ready()
    assert not page.error()
    assert page.last_answer_text().lstrip().startswith("{")
