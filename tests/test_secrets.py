"""A planted API key, given by flag, environment or client argument, reaches the server and no
other place: not EDN output, error maps, reprs, tracebacks, logs (DEBUG, httpx and httpcore
included), cassettes or bench reports. TLS verification is on unless turned off explicitly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import pathlib
import secrets
import ssl
import traceback
from typing import Any, Callable, Iterator

import httpx
import pytest

from faultserver import (FaultServer, Seen, Step, chat_answer, ok, refused_url, reply)
from kotoba_vllm import _errors as E
from kotoba_vllm._base_client import API_KEY_ENV
from kotoba_vllm._client import AsyncClient, Client
from kotoba_vllm._edn import dumps, pretty
from kotoba_vllm.cli import main

ROOT = pathlib.Path(__file__).parent.parent
KEY = "sk-planted-" + secrets.token_hex(12)
MSGS = [{"role": "user", "content": "hi"}]
REQ = '{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "hi"}]}\n'


def echo_headers(seen: Seen) -> list[Step]:
    """A careless server: its 400 body quotes every request header back, Authorization included."""
    return reply({"error": {"message": f"bad request with {seen.headers.get('authorization')}; headers were "
                                       f"{json.dumps(seen.headers)}",
                            "type": "invalid_request_error"}}, 400)


def route(seen: Seen) -> list[Step]:
    """Different faults by path, so one server exercises answers, errors and streams."""
    body = seen.json() or {}
    model = body.get("model") if isinstance(body, dict) else None
    if model == "echo":
        return echo_headers(seen)
    if model == "limited":
        return reply({"error": {"message": "slow down"}}, 429, [("retry-after", "2")])
    if seen.path in ("/metrics",):
        return reply(b"# no metrics\n", 200, [("content-type", "text/plain")])
    if seen.path in ("/slots", "/props"):  # capacity probes meet the careless server too
        return echo_headers(seen)
    return ok(seen)


class Channels:
    """Every text a user could see, by channel name."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str]] = []

    def add(self, channel: str, text: Any) -> None:
        self.texts.append((channel, text if isinstance(text, str) else repr(text)))

    def add_error(self, channel: str, e: BaseException) -> None:
        self.add(f"{channel} str", str(e))
        self.add(f"{channel} repr", repr(e))
        self.add(f"{channel} traceback", "".join(traceback.format_exception(e)))
        if isinstance(e, E.KotobaError):
            self.add(f"{channel} to_edn", dumps(e.to_edn()))
            self.add(f"{channel} pretty", pretty(e.to_edn()))

    def leaks(self) -> list[str]:
        secret_part = KEY.split("-")[-1]
        return [name for name, text in self.texts if secret_part in text or KEY in text]


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no registered secret, so each path must register its own key."""
    monkeypatch.setattr(E, "_SECRETS", set())


@pytest.fixture
def server() -> Iterator[FaultServer]:
    with FaultServer(route) as srv:
        yield srv


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)  # root, so httpx, httpcore, asyncio and ours all record
    for name in ("httpx", "httpcore", "kotoba_vllm", "asyncio", "hpack"):
        caplog.set_level(logging.DEBUG, logger=name)
    yield caplog


def _key_reached(server: FaultServer) -> None:
    """The test means something only if the key really went out."""
    assert any(s.headers.get("authorization") == f"Bearer {KEY}" for s in server.seen)


def _client_calls(c: Client, ch: Channels, tag: str) -> None:
    ch.add(f"{tag} client repr", repr(c))
    ch.add(f"{tag} client str", str(c))
    r = c.chat(MSGS)
    ch.add(f"{tag} response repr", repr(r))
    from kotoba_vllm._model import to_edn
    ch.add(f"{tag} response edn", dumps(to_edn(r)))
    with c.stream_chat(MSGS) as s:
        ch.add(f"{tag} stream repr", repr(s))
        for d in s:
            ch.add(f"{tag} delta", repr(d))
    ch.add(f"{tag} streamed response", repr(s.response))
    for model in ("echo", "limited"):
        for call in (lambda: c.chat(MSGS, model=model), lambda: c.stream_chat(MSGS, model=model).until_done()):
            try:
                call()
            except E.KotobaError as e:
                ch.add_error(f"{tag} {model}", e)
            else:
                raise AssertionError(f"{model} should fail")
    try:
        Client(refused_url(), backend="vllm", api_key=KEY).chat(MSGS)
    except E.Unreachable as e:
        ch.add_error(f"{tag} unreachable", e)


def test_client_argument_never_shows(server: FaultServer, logs: pytest.LogCaptureFixture) -> None:
    ch = Channels()
    with Client(server.base_url, backend="vllm", api_key=KEY) as c:  # the default wire (http.client)
        _client_calls(c, ch, "sync")
    with Client(server.base_url, backend="vllm", api_key=KEY, http_client=httpx.Client()) as c:  # httpx logs
        _client_calls(c, ch, "sync-httpx")

    async def go() -> None:
        async with AsyncClient(server.base_url, backend="vllm", api_key=KEY) as c:
            ch.add("async client repr", repr(c))
            ch.add("async response", repr(await c.chat(MSGS)))
            s = await c.stream_chat(MSGS)
            async with s:
                ch.add("async streamed", repr(await s.until_done()))
            for model in ("echo", "limited"):
                try:
                    await c.chat(MSGS, model=model)
                except E.KotobaError as e:
                    ch.add_error(f"async {model}", e)

    asyncio.run(go())
    _key_reached(server)
    assert "headers were" in dumps([t for _, t in ch.texts])  # the echoing server really echoed
    ch.add("logs", logs.text)
    ch.add("log records", [(r.getMessage(), r.args) for r in logs.records])
    assert len(logs.records) > 10  # DEBUG logging really was on
    leaks = ch.leaks()
    assert not leaks, f"the planted key shows in: {leaks}"


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str], ch: Channels, tag: str) -> int:
    rc = main(argv)
    out, err = capsys.readouterr()
    ch.add(f"{tag} stdout", out)
    ch.add(f"{tag} stderr", err)
    return rc


@pytest.mark.parametrize("how", ["flag", "env"])
def test_cli_run_never_prints_the_key(how: str, server: FaultServer, tmp_path: pathlib.Path,
                                      capsys: pytest.CaptureFixture[str], logs: pytest.LogCaptureFixture,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ch = Channels()
    key_args = ["--api-key", KEY] if how == "flag" else []
    if how == "env":
        monkeypatch.setenv(API_KEY_ENV, KEY)
    f = tmp_path / "req.edn"
    f.write_text(REQ + REQ.replace(":vllm/endpoint :chat", ':vllm/endpoint :chat :vllm/model "echo"')
                 + REQ.replace(":vllm/endpoint :chat", ':vllm/endpoint :chat :vllm/model "limited"'))
    out = tmp_path / "out.edn"
    for extra in ([], ["--stream"], ["--pretty", "-o", str(out)]):
        _cli(["run", str(f), "--base-url", server.base_url, "-b", "vllm", *key_args, *extra], capsys, ch,
             f"run {extra}")
    _cli(["run", str(f), "--base-url", refused_url(), "-b", "vllm", *key_args], capsys, ch, "run refused")
    E._SECRETS.clear()  # capacity probes without a Client: the CLI must register the key itself
    _cli(["capacity", server.base_url, "-b", "llamacpp", *key_args], capsys, ch, "capacity")
    ch.add("run -o file", out.read_text(encoding="utf-8"))
    ch.add("logs", logs.text)
    _key_reached(server)
    leaks = ch.leaks()
    assert not leaks, f"the planted key shows in: {leaks}"


def test_bench_report_never_holds_the_key(server: FaultServer, tmp_path: pathlib.Path,
                                          capsys: pytest.CaptureFixture[str], logs: pytest.LogCaptureFixture,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, KEY)  # bench's clients take the key from the environment
    ch = Channels()
    report = tmp_path / "bench.edn"
    _cli(["bench", "--base-url", server.base_url, "-b", "vllm", "--requests", "2", "--warmup", "0",
          "--no-metrics", "-q", "-o", str(report)], capsys, ch, "bench")
    assert report.exists()
    ch.add("bench report", report.read_text(encoding="utf-8"))
    ch.add("logs", logs.text)
    _key_reached(server)
    leaks = ch.leaks()
    assert not leaks, f"the planted key shows in: {leaks}"


def test_cassettes_hold_no_credentials() -> None:
    """Recorded cassettes keep response headers only, from a fixed list without credentials."""
    from kotoba_vllm.cassettes import KEPT_HEADERS

    assert not {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"} & set(KEPT_HEADERS)
    files = [p for p in (ROOT / "tests" / "cassettes").rglob("*") if p.is_file()]
    for p in files:
        text = p.read_text(encoding="utf-8", errors="replace").lower()
        assert "authorization" not in text and "bearer " not in text, p
        assert KEY.lower() not in text


def test_tls_verification_is_on_by_default_and_off_only_when_asked() -> None:
    def context(verify: bool) -> ssl.SSLContext:
        c = Client("https://127.0.0.1:1", backend="vllm", verify=verify)
        assert c.transport == "stdlib"
        ctx: ssl.SSLContext = c._wire._context()  # type: ignore[attr-defined]  # the default wire's own
        c.close()
        return ctx

    assert context(True).verify_mode == ssl.CERT_REQUIRED and context(True).check_hostname is True
    assert context(False).verify_mode == ssl.CERT_NONE and context(False).check_hostname is False

    async def wire_ssl(verify: bool) -> object:
        a = AsyncClient("https://127.0.0.1:1", backend="vllm", verify=verify)
        assert a.transport == "aiohttp"
        session = a._wire._open()  # type: ignore[attr-defined]
        setting = session.connector._ssl  # type: ignore[union-attr]  # True: verify (its default)
        await a.aclose()
        return setting

    assert asyncio.run(wire_ssl(True)) is True
    assert asyncio.run(wire_ssl(False)) is False
