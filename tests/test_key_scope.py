"""The API key reaches only the origins the user configured, on real loopback sockets.

A request that names another server (EDN `:vllm/base-url`, a JSONL line's absolute `url`, a
map given to `Client.send`, a request given to a `Pool`) is sent there without the key; a
401/403 from it says the key was withheld and how to trust the origin."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from faultserver import FaultServer, Seen, Step, ok, reply
from kotoba_vllm import AsyncClient, BadRequest, Client, Pool
from kotoba_vllm._edn import kw, read_all
from kotoba_vllm._errors import REDACTED, redact, redact_headers
from kotoba_vllm._origins import TrustedOrigins, origin_of
from kotoba_vllm.cli import main

KEY = "sk-scope-test-0123456789"
MSG = [{kw("vllm/role"): kw("user"), kw("vllm/content"): "hi"}]


def needs_key(seen: Seen) -> list[Step]:
    """A server behind auth: 401 without our key (quoting what it got), an answer with it."""
    if seen.headers.get("authorization") != f"Bearer {KEY}":
        return reply({"error": {"message": f"missing or bad key: {seen.headers.get('authorization')}",
                                "type": "authentication_error"}}, 401)
    return ok(seen)


@pytest.fixture
def home() -> Iterator[FaultServer]:
    with FaultServer() as srv:
        yield srv


@pytest.fixture
def other() -> Iterator[FaultServer]:
    with FaultServer(needs_key) as srv:
        yield srv


def auth_seen(srv: FaultServer, *, posts_only: bool = False) -> list[str | None]:
    """The authorization header of every request the server read (posts only: not run's capacity probes)."""
    return [s.headers.get("authorization") for s in srv.seen if not posts_only or s.method == "POST"]


def edn_request(base_url: str | None = None) -> dict[Any, Any]:
    m = {kw("vllm/endpoint"): kw("chat"), kw("vllm/messages"): MSG}
    if base_url is not None:
        m[kw("vllm/base-url")] = base_url
    return m


def test_client_send_map_naming_another_origin_goes_there_without_the_key(home: FaultServer,
                                                                          other: FaultServer) -> None:
    with Client(home.base_url, backend="vllm", api_key=KEY) as c:
        assert c.send(edn_request()).text == "Hello"
        with pytest.raises(BadRequest) as ei:
            c.send(edn_request(other.base_url))
    assert auth_seen(home) == [f"Bearer {KEY}"]
    assert auth_seen(other) == [None]  # sent, without the key
    e = ei.value
    assert e.status == 401 and "withheld" in e.message and other.base_url in e.message
    assert "trusted_origins" in e.message and "--trust-origin" in e.message and ":pool/members" in e.message
    assert e.to_edn()[kw("vllm/key-withheld")] == e.key_withheld


def test_async_client_and_auto_detection_probes_never_carry_the_key_elsewhere(home: FaultServer,
                                                                              other: FaultServer) -> None:
    async def go() -> None:
        async with AsyncClient(home.base_url, backend="auto", api_key=KEY) as c:
            with pytest.raises(BadRequest):
                await c.send(edn_request(other.base_url))
    asyncio.run(go())
    assert other.seen and all(a is None for a in auth_seen(other))  # detection GETs and the POST


def test_a_trusted_origin_gets_the_key(home: FaultServer, other: FaultServer) -> None:
    # the same origin spelled differently (upper case, trailing slash, /v1) is the same origin
    spelled = other.base_url.replace("http://", "HTTP://") + "/v1/"
    with Client(home.base_url, backend="vllm", api_key=KEY, trusted_origins=[spelled]) as c:
        assert c.send(edn_request(other.base_url)).text == "Hello"
    assert auth_seen(other) == [f"Bearer {KEY}"]


def test_the_same_host_on_another_port_is_another_origin(home: FaultServer, other: FaultServer) -> None:
    assert origin_of(home.base_url)[:2] == origin_of(other.base_url)[:2]  # type: ignore[index]
    with Client(home.base_url, backend="vllm", api_key=KEY) as c, pytest.raises(BadRequest):
        c.send(edn_request(other.base_url))
    assert auth_seen(other) == [None]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[Any], str]:
    code = main(["run", *args, "--no-progress", "-b", "vllm", "--timeout", "10"])
    out, err = capsys.readouterr()
    return code, read_all(out) if out.strip() else [], err


def test_run_edn_file_naming_another_origin_never_delivers_the_key(
        home: FaultServer, other: FaultServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "in.edn"
    path.write_text('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "a"}]}\n'
                    '{:vllm/endpoint :chat :vllm/base-url "%s" '
                    ':vllm/messages [{:vllm/role :user :vllm/content "b"}]}\n' % other.base_url, encoding="utf-8")
    code, records, _ = _run([str(path), "--base-url", home.base_url, "--api-key", KEY], capsys)
    assert code == 1 and [r[kw("vllm/request-index")] for r in records] == [0, 1]
    assert auth_seen(home, posts_only=True) == [f"Bearer {KEY}"]  # run also probes home's capacity, same origin
    assert auth_seen(other, posts_only=True) == [None] and set(auth_seen(other)) == {None}
    rec = records[1]
    assert rec[kw("vllm/status")] == 401 and "withheld" in rec[kw("vllm/message")]
    assert KEY not in repr(records)
    # trusting the origin explicitly sends it there
    code, records, _ = _run([str(path), "--base-url", home.base_url, "--api-key", KEY,
                             "--trust-origin", other.base_url], capsys)
    assert code == 0 and auth_seen(other)[-1] == f"Bearer {KEY}"


def test_run_jsonl_absolute_url_naming_another_origin_never_delivers_the_key(
        home: FaultServer, other: FaultServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    lines = [{"custom_id": "home", "method": "POST", "url": "/v1/chat/completions", "body": body},
             {"custom_id": "away", "method": "POST", "url": other.base_url + "/v1/chat/completions", "body": body}]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    code = main(["run", str(path), "--base-url", home.base_url, "--api-key", KEY, "--no-progress", "-b", "vllm"])
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert code == 1 and [o["custom_id"] for o in out] == ["home", "away"]
    assert auth_seen(home, posts_only=True) == [f"Bearer {KEY}"]  # run also probes home's capacity, same origin
    assert auth_seen(other, posts_only=True) == [None] and set(auth_seen(other)) == {None}
    assert out[1]["error"]["code"] == "bad-request" and "withheld" in out[1]["error"]["message"]


def test_a_pool_never_sends_a_request_named_origin_anything(home: FaultServer, other: FaultServer) -> None:
    with Pool([home.base_url], backend="vllm", api_key=KEY, probe_timeout=2.0) as pool:
        r = pool.send(edn_request(other.base_url))
    assert r.text == "Hello" and r.extras["pool/member"] == home.base_url
    assert other.seen == []  # the pool picks the member: a URL in the request never bypasses it
    assert set(auth_seen(home)) == {f"Bearer {KEY}"}


def test_run_help_states_the_real_precedence(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "A request's own :vllm/base-url" in text and "wins over it" in text and "WITHOUT the API key" in text
    assert "--trust-origin" in text


# ------------------------------------------------------------------ redaction


@pytest.mark.parametrize("key", ["k", "abc", "short7!", KEY])
def test_authorization_values_are_redacted_whatever_the_key_length(key: str) -> None:
    dumped = json.dumps({"Authorization": f"Bearer {key}", "host": "h"})
    for text in (f"authorization: Bearer {key}", f"Authorization: {key}", dumped, f"got bearer {key}."):
        shown = redact(text)
        assert shown is not None and key not in shown.replace(REDACTED, ""), (text, shown)
    assert redact_headers({"Authorization": f"Bearer {key}", "x": "y"}) == {"Authorization": REDACTED, "x": "y"}


def test_free_text_redaction_starts_at_eight_characters() -> None:
    with Client("http://127.0.0.1:9", api_key="abc"):
        assert redact("the word abc stays") == "the word abc stays"  # a 3-character key would blank words
    with Client("http://127.0.0.1:9", api_key="abcdefgh"):
        assert redact("key abcdefgh here") == f"key {REDACTED} here"


def test_a_short_key_echoed_in_an_error_body_is_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    def echo(seen: Seen) -> list[Step]:
        return reply({"error": {"message": f"bad: {json.dumps(seen.headers)}"}}, 400)

    with FaultServer(echo) as srv, Client(srv.base_url, backend="vllm", api_key="xyz") as c:
        with pytest.raises(BadRequest) as ei:
            c.chat("hi")
    from kotoba_vllm._edn import dumps
    shown = dumps(ei.value.to_edn()) + str(ei.value)
    assert "Bearer xyz" not in shown and REDACTED in shown


def test_origins_are_scheme_host_port() -> None:
    t = TrustedOrigins(["https://a.example"])
    assert t.allows("https://A.example:443/v1") and not t.allows("http://a.example")
    assert not t.allows("https://a.example.evil.test") and not t.allows("https://a.example:8443")
    assert origin_of("not a url") is None and origin_of("http://[::1]:80/x") == ("http", "::1", 80)


def test_a_callers_own_http_client_key_is_withheld_too(other: FaultServer) -> None:
    import httpx
    own = httpx.Client(headers={"Authorization": f"Bearer {KEY}"})
    with Client("http://127.0.0.1:9", backend="vllm", http_client=own) as c, pytest.raises(BadRequest) as ei:
        c.send(edn_request(other.base_url))
    assert auth_seen(other) == [None] and "withheld" in ei.value.message
