"""Engine fields beyond the sampling table (kotoba_vllm/_fields.py): from EDN and from keyword arguments,
checked as the engines check them, rendered per dialect, refused by name elsewhere; the pass-through;
request ids on the wire."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kotoba_vllm import Client, ValidationError
from kotoba_vllm._base_client import chat_request
from kotoba_vllm._edn import kw, read_all
from kotoba_vllm._model import GenerateRequest, to_edn
from kotoba_vllm._requests import request_from_edn, request_to_edn
from kotoba_vllm._validate import validate
from kotoba_vllm.dialects import get_dialect
from kotoba_vllm.local import free_port

CHAT = '{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "hi"}] :vllm/sampling {:vllm/max-tokens 8} '


def req(extra: str, head: str = CHAT):
    r, problems = request_from_edn(read_all(head + extra + "}")[0])
    assert problems == [] and r is not None
    return r


def errors(r, backend: str | None = None) -> list[tuple[str, str | None]]:
    return [(p.code, p.field) for p in validate(r, backend) if p.is_error]


def body(r, backend: str) -> dict:
    assert errors(r, backend) == []
    b = get_dialect(backend).render(r).body
    assert b is not None
    return b


def test_the_why_fields_render_on_vllm() -> None:
    r = req(':vllm/chat-template-kwargs {:enable_thinking false} :vllm/priority 5 :vllm/min-tokens 3 '
            ':vllm/ignore-eos true :vllm/logit-bias {50 100 "7" -100} :vllm/cache-salt "s1" '
            ':vllm.engine/bad-words ["x"] :vllm.engine/allowed-token-ids [1 2] :vllm.engine/prompt-logprobs 1 '
            ':vllm.engine/truncate-prompt-tokens 100 :vllm/stop-token-ids [2] :vllm/skip-special-tokens false '
            ':vllm/parallel-tool-calls false :vllm.engine/return-tokens-as-token-ids true '
            ':vllm/mm-processor-kwargs {:fps 2}')
    b = body(r, "vllm")
    assert b["chat_template_kwargs"] == {"enable_thinking": False} and b["priority"] == 5
    assert b["min_tokens"] == 3 and b["ignore_eos"] is True and b["logit_bias"] == {"50": 100, "7": -100}
    assert b["cache_salt"] == "s1" and b["bad_words"] == ["x"] and b["allowed_token_ids"] == [1, 2]
    assert b["prompt_logprobs"] == 1 and b["truncate_prompt_tokens"] == 100 and b["stop_token_ids"] == [2]
    assert b["skip_special_tokens"] is False and b["parallel_tool_calls"] is False
    assert b["return_tokens_as_token_ids"] is True and b["mm_processor_kwargs"] == {"fps": 2}


def test_continuous_usage_stats_joins_the_stream_options() -> None:
    r = req(':vllm/stream true :vllm/continuous-usage-stats true')
    assert body(r, "vllm")["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert errors(req(':vllm/continuous-usage-stats true')) == [("request/stream", "vllm/continuous-usage-stats")]


def test_sglang_generate_puts_sampling_fields_in_sampling_params() -> None:
    r = req(':vllm/min-tokens 2 :vllm/ignore-eos true :sglang/ebnf "root ::= \\"a\\"" :sglang/stop-regex "x+" '
            ':sglang/no-stop-trim true :sglang/return-hidden-states true :sglang/session-params {:id "s"} '
            ':vllm/request-id "r-9"',
            head='{:vllm/endpoint :generate :vllm/prompt "p" :vllm/sampling {:vllm/max-tokens 8} ')
    b = body(r, "sglang")
    sp = b["sampling_params"]
    assert sp == {"max_new_tokens": 8, "min_new_tokens": 2, "ignore_eos": True, "ebnf": 'root ::= "a"',
                  "stop_regex": "x+", "no_stop_trim": True}
    assert b["return_hidden_states"] is True and b["session_params"] == {"id": "s"} and b["rid"] == "r-9"


def test_sglang_chat_fields() -> None:
    b = body(req(':sglang/separate-reasoning true :vllm/chat-template-kwargs {:enable_thinking true} '
                 ':vllm/min-tokens 1'), "sglang")
    assert b["separate_reasoning"] is True and b["min_tokens"] == 1
    assert b["chat_template_kwargs"] == {"enable_thinking": True}


def test_llamacpp_native_fields() -> None:
    r = req(':llamacpp/dry-multiplier 0.8 :llamacpp/dry-base 1.75 :llamacpp/dry-allowed-length 2 '
            ':llamacpp/dry-penalty-last-n 64 :llamacpp/dry-sequence-breakers ["\\n"] :llamacpp/xtc-probability 0.5 '
            ':llamacpp/xtc-threshold 0.1 :llamacpp/mirostat 2 :llamacpp/mirostat-tau 5.0 :llamacpp/mirostat-eta 0.1 '
            ':llamacpp/typical-p 0.9 :llamacpp/lora [{:id 0 :scale 0.5}] :llamacpp/t-max-predict-ms 500 '
            ':llamacpp/n-cmpl 1 :vllm/ignore-eos true :vllm/logit-bias {3 -100}',
            head='{:vllm/endpoint :generate :vllm/prompt "p" :vllm/sampling {:vllm/max-tokens 8} ')
    b = body(r, "llamacpp")
    assert b["dry_multiplier"] == 0.8 and b["dry_sequence_breakers"] == ["\n"] and b["xtc_probability"] == 0.5
    assert b["mirostat"] == 2 and b["typical_p"] == 0.9 and b["lora"] == [{"id": 0, "scale": 0.5}]
    assert b["t_max_predict_ms"] == 500 and b["n_cmpl"] == 1 and b["logit_bias"] == {"3": -100}
    assert b["n_predict"] == 8


@pytest.mark.parametrize("extra,engine,field", [
    (':vllm/priority 5', "llamacpp", "vllm/priority"),
    (':vllm.engine/bad-words ["x"]', "sglang", "vllm.engine/bad-words"),
    (':sglang/ebnf "x"', "vllm", "sglang/ebnf"),
    (':llamacpp/mirostat 1', "vllm", "llamacpp/mirostat"),
    (':vllm/chat-template-kwargs {:a 1}', "openai", "vllm/chat-template-kwargs"),
])
def test_a_field_the_engine_lacks_is_refused_by_name(extra: str, engine: str, field: str) -> None:
    problems = [p for p in validate(req(extra), engine) if p.is_error]
    assert [(p.code, p.field, p.engine) for p in problems] == [("engine/unsupported", field, engine)]
    assert engine in problems[0].msg and field in problems[0].msg
    with pytest.raises(ValidationError):
        get_dialect(engine).render(req(extra))  # rendered without validating: still never dropped


@pytest.mark.parametrize("extra,code,field", [
    (':vllm/min-tokens "3"', "request/type", "vllm/min-tokens"),
    (':vllm/min-tokens -1', "sampling/range", "vllm/min-tokens"),
    (':vllm/min-tokens 9', "sampling/min-tokens", "vllm/min-tokens"),  # max-tokens is 8: vLLM's own rule
    (':vllm/logit-bias {50 101}', "sampling/range", "vllm/logit-bias"),
    (':vllm/logit-bias {:a 1}', "request/type", "vllm/logit-bias"),
    (':vllm/chat-template-kwargs [1]', "request/type", "vllm/chat-template-kwargs"),
    (':vllm/priority 1.5', "request/type", "vllm/priority"),
    (':vllm.engine/truncate-prompt-tokens -2', "sampling/range", "vllm.engine/truncate-prompt-tokens"),
    (':vllm/stop-token-ids [1 "2"]', "request/type", "vllm/stop-token-ids"),
    (':llamacpp/mirostat 3', "sampling/range", "llamacpp/mirostat"),
    (':llamacpp/no-such-knob 1', "request/unknown-key", "llamacpp/no-such-knob"),
    (':vllm/extra-body {:api_key "k"}', "request/pass-through", "vllm/extra-body"),
    (':vllm/extra-headers {"Authorization" "Bearer k"}', "request/pass-through", "vllm/extra-headers"),
    (':vllm/extra-headers {"x-a" 1}', "request/type", "vllm/extra-headers"),
])
def test_bad_values_are_problems_naming_the_field(extra: str, code: str, field: str) -> None:
    assert (code, field) in errors(req(extra))


def test_vllm_cross_field_rules() -> None:
    assert ("engine/value", "vllm/cache-salt") in errors(req(':vllm/cache-salt "a/b"'), "vllm")
    assert errors(req(':vllm/cache-salt "a/b"'), "sglang") == []
    assert ("request/stream", "vllm.engine/prompt-logprobs") in errors(
        req(':vllm/stream true :vllm.engine/prompt-logprobs 2'))


def test_an_unknown_shared_key_is_still_unknown() -> None:
    _, problems = request_from_edn(read_all(CHAT + ':vllm/no-such-field 1}')[0])
    assert [(p.code, p.field) for p in problems] == [("request/unknown-key", "vllm/no-such-field")]


def test_new_fields_round_trip_as_edn() -> None:
    r = req(':vllm/priority 5 :vllm/logit-bias {50 100} :sglang/ebnf "x" :vllm.engine/bad-words ["a"]')
    again, problems = request_from_edn(request_to_edn(r))
    assert problems == [] and again == r


def test_keyword_arguments_are_named_as_the_engines_name_them() -> None:
    r = chat_request("hi", None, None, False, {"max_tokens": 8, "min_tokens": 2, "ignore_eos": True,
                                               "chat_template_kwargs": {"enable_thinking": False}, "priority": 3,
                                               "logit_bias": {5: 100}, "cache_salt": "s", "request_id": "id-1",
                                               "tool_choice": "none", "extra_body": {"foo": 1}}, None)
    b = body(r, "vllm")
    assert b["min_tokens"] == 2 and b["ignore_eos"] is True and b["priority"] == 3 and b["cache_salt"] == "s"
    assert b["chat_template_kwargs"] == {"enable_thinking": False} and b["logit_bias"] == {"5": 100}
    assert b["request_id"] == "id-1" and b["tool_choice"] == "none" and b["foo"] == 1 and b["max_tokens"] == 8
    assert get_dialect("vllm").render(r).headers == {"x-request-id": "id-1"}


def test_a_bad_keyword_argument_sends_nothing() -> None:
    with Client(f"http://127.0.0.1:{free_port()}", backend="vllm") as c:  # nothing listens: a send would fail
        for kwargs in ({"min_tokens": "2"}, {"priority": 5, "min_tokens": 5},
                       {"extra_body": {"messages": []}}, {"no_such_argument": 1}):
            with pytest.raises(ValidationError):
                c.chat("hi", max_tokens=4, **kwargs)
        with pytest.raises(ValidationError) as e:
            Client(f"http://127.0.0.1:{free_port()}", backend="llamacpp").chat("hi", priority=1)
        assert e.value.problems[0].field == "vllm/priority" and e.value.problems[0].engine == "llamacpp"


def test_extra_body_merges_verbatim_with_a_warning_per_key() -> None:
    r = req(':vllm/extra-body {:foo 1 "bar_baz" {:x [1 2]}}')
    warns = [p for p in validate(r, "vllm") if not p.is_error]
    assert [(p.code, p.field) for p in warns] == [("request/unchecked", "vllm/extra-body")] * 2
    assert "'foo'" in warns[0].msg and "'bar_baz'" in warns[1].msg
    b = body(r, "vllm")
    assert b["foo"] == 1 and b["bar_baz"] == {"x": [1, 2]}


def test_extra_body_never_overrides_a_rendered_key() -> None:
    r = req(':vllm/extra-body {:max_tokens 99}')
    assert ("request/pass-through", "vllm/extra-body") in errors(r, "vllm")
    with pytest.raises(ValidationError):
        get_dialect("vllm").render(r)


def test_extra_body_on_sglang_generate_puts_sampling_keys_in_sampling_params() -> None:
    r = req(':vllm/extra-body {:structural_tag "t" :return_entropy true}',
            head='{:vllm/endpoint :generate :vllm/prompt "p" :vllm/sampling {:vllm/max-tokens 8} ')
    b = body(r, "sglang")
    assert b["sampling_params"]["structural_tag"] == "t" and b["return_entropy"] is True
    clash = req(':vllm/extra-body {:max_new_tokens 9}',
                head='{:vllm/endpoint :generate :vllm/prompt "p" :vllm/sampling {:vllm/max-tokens 8} ')
    assert ("request/pass-through", "vllm/extra-body") in errors(clash, "sglang")


def test_extra_headers_go_on_the_request() -> None:
    r = req(':vllm/extra-headers {"X-Trace" "t1"} :vllm/request-id 7')
    assert get_dialect("llamacpp").render(r).headers == {"x-trace": "t1", "x-request-id": "7"}


def test_request_id_reaches_each_engine_where_it_reads_one() -> None:
    r = req(':vllm/request-id "abc-1"')
    vllm = get_dialect("vllm").render(r)
    assert vllm.body is not None and vllm.body["request_id"] == "abc-1" and vllm.headers == {"x-request-id": "abc-1"}
    sglang = get_dialect("sglang").render(r)
    assert sglang.body is not None and sglang.body["rid"] == "abc-1"
    for engine in ("llamacpp", "openai"):
        http = get_dialect(engine).render(r)
        assert http.headers == {"x-request-id": "abc-1"} and http.body is not None and "request_id" not in http.body
    assert errors(req(':vllm/request-id "a" :sglang/rid "b"'), "sglang") == [("request/conflict", "sglang/rid")]


def test_a_request_without_new_fields_renders_as_before() -> None:
    r = req("")
    http = get_dialect("vllm").render(r)
    assert http.headers is None and http.body == {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    assert GenerateRequest(prompt="p").extras == {}


# ------------------------------------------------------------------ on a real socket: what the server reads, what comes back

from faultserver import FaultServer, Seen, chat_answer, reply, sse_stream  # noqa: E402

from kotoba_vllm import AsyncClient, BadRequest  # noqa: E402


def echo_id(seen: Seen) -> list:
    """A server that answers with the id it was sent, as vLLM does with --enable-request-id-headers."""
    rid = seen.headers.get("x-request-id", "server-made")
    if (seen.json() or {}).get("stream"):
        steps = sse_stream(["Hel", "lo"])
        first = steps[0]
        assert isinstance(first, bytes)
        steps[0] = first.replace(b"\r\n\r\n", f"\r\nx-request-id: {rid}\r\n\r\n".encode(), 1)
        return steps
    if (seen.json() or {}).get("priority"):
        return reply({"error": {"message": "Priority scheduling is not enabled.", "type": "BadRequestError",
                                "code": 400}}, status=400, headers=[("x-request-id", rid)])
    return reply(chat_answer("Hello"), headers=[("x-request-id", rid)])


def test_the_request_id_and_headers_reach_the_server_and_the_servers_id_comes_back() -> None:
    with FaultServer(echo_id) as srv, Client(srv.base_url, backend="vllm") as c:
        r = c.chat("hi", max_tokens=4, request_id="abc-1", extra_headers={"X-Trace": "t1"}, min_tokens=2)
        seen = srv.seen[-1]
        assert seen.headers["x-request-id"] == "abc-1" and seen.headers["x-trace"] == "t1"
        assert seen.json()["request_id"] == "abc-1" and seen.json()["min_tokens"] == 2
        assert (r.request_id, r.server_request_id) == ("abc-1", "abc-1")
        with c.stream_chat("hi", max_tokens=4, request_id="s-2") as s:
            assert "".join(d.delta for d in s) == "Hello"
        assert s.response is not None and s.response.server_request_id == "s-2"
        with pytest.raises(BadRequest) as e:
            c.chat("hi", max_tokens=4, request_id="p-3", priority=5)
        assert (e.value.request_id, e.value.server_request_id) == ("p-3", "p-3")
        edn = e.value.to_edn()
        assert edn[kw("vllm/request-id")] == "p-3" and edn[kw("vllm/server-request-id")] == "p-3"


async def test_the_same_from_the_async_client() -> None:
    with FaultServer(echo_id) as srv:
        async with AsyncClient(srv.base_url, backend="vllm") as c:
            r = await c.chat("hi", max_tokens=4, request_id="a-1", chat_template_kwargs={"enable_thinking": False},
                             extra_body={"vllm_xargs_custom": 1})
            body = srv.seen[-1].json()
            assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["vllm_xargs_custom"] == 1
            assert srv.seen[-1].headers["x-request-id"] == "a-1" and r.server_request_id == "a-1"
            s = await c.stream_chat("hi", max_tokens=4, request_id="a-2")
            assert "".join([d.delta async for d in s]) == "Hello"
            assert s.response is not None and s.response.server_request_id == "a-2"
            with pytest.raises(BadRequest) as e:
                await c.chat("hi", max_tokens=4, request_id="a-3", priority=5)
            assert e.value.server_request_id == "a-3"


# ------------------------------------------------------------------ request ids across a batch

from kotoba_vllm._edn import read_all as _read_all  # noqa: E402
from kotoba_vllm.cli import main  # noqa: E402


def _records(text: str) -> list[dict]:
    return [v for v in _read_all(text)]


def test_two_requests_with_one_id_are_a_problem_naming_both_positions(tmp_path, capsys) -> None:
    f = tmp_path / "dup.edn"
    f.write_text(CHAT + ':vllm/request-id "a"}\n' + CHAT + ':vllm/request-id "b"}\n' + CHAT + ':vllm/request-id "a"}\n')
    assert main(["validate", str(f)]) == 1
    [p] = _records(capsys.readouterr().out)
    assert p[kw("vllm/code")] == kw("batch/duplicate-request-id") and p[kw("vllm/request-index")] == 2
    assert "requests 0 and 2" in p[kw("vllm/msg")] and p[kw("vllm/where")].endswith(":3:1")


def test_run_gives_every_request_an_id_and_the_record_carries_both(tmp_path, capsys) -> None:
    f = tmp_path / "reqs.edn"
    f.write_text(CHAT + '}\n' + CHAT + ':vllm/request-id "mine"}\n' + CHAT + ':vllm/request-id "mine"}\n')
    with FaultServer(echo_id) as srv:
        code = main(["run", str(f), "--base-url", srv.base_url, "--backend", "vllm", "--request-ids", "--no-progress",
                     "--concurrency", "1"])
        sent = [(s.headers.get("x-request-id"), s.json().get("request_id")) for s in srv.seen
                if s.path == "/v1/chat/completions"]  # run may also probe the server's capacity
    out = _records(capsys.readouterr().out)
    assert code != 0  # the duplicate is a validation problem: never sent
    assert len(out) == 3 and len(sent) == 2
    generated = out[0][kw("vllm/request-id")]
    assert generated.startswith("kotoba-") and generated.endswith("-0")
    assert sent == [(generated, generated), ("mine", "mine")]
    assert out[0][kw("vllm/server-request-id")] == generated and out[1][kw("vllm/server-request-id")] == "mine"
    assert kw("vllm/error") in out[2]


def _stale_second(seen: Seen) -> list:
    """The 2nd request on connection 0 is read and never answered (a keep-alive the server closed)."""
    from faultserver import CLOSE, ok
    return [CLOSE] if seen.conn == 0 and seen.index == 1 else ok(seen)


def test_a_resent_request_keeps_its_id_and_the_answer_says_it_went_twice() -> None:
    with FaultServer(_stale_second) as srv, Client(srv.base_url, backend="vllm") as c:
        first = c.chat("hi", request_id="r-1")
        second = c.chat("hi", request_id="r-2")
        ids = [(s.conn, s.headers["x-request-id"], s.json()["request_id"]) for s in srv.seen]
    assert first.sends is None and second.sends == 2
    assert ids == [(0, "r-1", "r-1"), (0, "r-2", "r-2"), (1, "r-2", "r-2")]
    assert to_edn(second)[kw("vllm/sends")] == 2


async def test_a_resent_request_keeps_its_id_async() -> None:
    with FaultServer(_stale_second) as srv:
        async with AsyncClient(srv.base_url, backend="vllm") as c:
            await c.chat("hi", request_id="a-1")
            s = await c.stream_chat("hi", request_id="a-2")
            async for _ in s:
                pass
        ids = [s_.headers["x-request-id"] for s_ in srv.seen]
    assert ids == ["a-1", "a-2", "a-2"] and s.response is not None and s.response.sends == 2


# ------------------------------------------------------------------ content parts per engine

AUDIO = '{:vllm/type :input-audio :vllm/data "UklGRg==" :vllm/format :wav}'
VIDEO = '{:vllm/type :input-video :vllm/url "file://v.mp4"}'
EMBEDS = '{:vllm/type :image-embeds :vllm/data "AAAA"}'


def parts_req(*parts: str):
    head = '{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content [' + " ".join(parts) + ']}]'
    r, problems = request_from_edn(read_all(head + "}")[0])
    assert problems == [] and r is not None
    return r


def test_input_audio_renders_as_openai_s_part() -> None:
    for engine in ("vllm", "sglang", "llamacpp", "openai"):
        b = body(parts_req('{:vllm/type :text :vllm/text "what is this"}', AUDIO), engine)
        assert b["messages"][0]["content"][1] == {"type": "input_audio",
                                                  "input_audio": {"data": "UklGRg==", "format": "wav"}}


def test_each_engine_takes_exactly_its_part_types() -> None:
    assert body(parts_req(VIDEO), "llamacpp")["messages"][0]["content"] == [
        {"type": "input_video", "input_video": {"url": "file://v.mp4"}}]
    assert body(parts_req(EMBEDS), "vllm")["messages"][0]["content"] == [{"type": "image_embeds",
                                                                           "image_embeds": "AAAA"}]
    for part, refused_by in ((VIDEO, ("vllm", "sglang", "openai")), (EMBEDS, ("sglang", "llamacpp", "openai")),
                             ('{:vllm/type :audio-url :vllm/url "http://a"}', ("llamacpp", "openai"))):
        for engine in refused_by:
            problems = [p for p in validate(parts_req(part), engine) if p.is_error]
            assert [(p.code, p.engine) for p in problems] == [("engine/unsupported", engine)]
            assert "part 0" in problems[0].msg and engine in problems[0].msg


def test_a_part_without_what_its_type_needs_is_a_problem() -> None:
    r = parts_req('{:vllm/type :input-audio :vllm/data "UklGRg=="}')
    assert ("message/part", "vllm/format") in errors(r, "vllm")


def test_openai_style_input_audio_dicts_are_kept() -> None:
    r = chat_request([{"role": "user", "content": [{"type": "input_audio",
                                                    "input_audio": {"data": "UklGRg==", "format": "mp3"}}]}],
                     None, None, False, {}, None)
    assert body(r, "vllm")["messages"][0]["content"][0]["input_audio"] == {"data": "UklGRg==", "format": "mp3"}


# ------------------------------------------------------------------ the server's version

def _vllm_of(version: str):
    def script(seen: Seen) -> list:
        if seen.path == "/version":
            return reply({"version": version})
        if seen.path in ("/props", "/server_info", "/get_server_info"):
            return reply({"detail": "Not Found"}, status=404)
        return reply(chat_answer("Hello"))
    return script


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_field_the_detected_version_lacks_is_a_problem(flavour: str) -> None:
    """return_weight_versions is in vLLM 0.33.0's ChatCompletionRequest, not 0.32.0's
    (schemas/engine-fields/): against a detected 0.32.0 it would be logged and ignored."""
    for version, refused in (("0.32.0", True), ("0.33.0", False)):
        with FaultServer(_vllm_of(version)) as srv:
            async def go() -> Any:
                async with AsyncClient(srv.base_url) as c:
                    return await c.chat("hi", return_weight_versions=True, min_tokens=1)

            def call() -> Any:
                if flavour == "async":
                    return asyncio.run(go())
                with Client(srv.base_url) as c:
                    return c.chat("hi", return_weight_versions=True, min_tokens=1)

            if refused:
                with pytest.raises(ValidationError) as e:
                    call()
                assert [(p.code, p.field) for p in e.value.problems if p.is_error] == [
                    ("engine/version", "vllm.engine/return-weight-versions")]
                assert "0.32.0" in e.value.problems[-1].msg
                assert not [s for s in srv.seen if s.path == "/v1/chat/completions"]  # nothing sent
            else:
                assert call().text == "Hello"


# ------------------------------------------------------------------ local media

def test_a_local_file_becomes_a_data_url_only_from_a_trusted_directory(tmp_path, capsys) -> None:
    import base64
    (tmp_path / "cat.png").write_bytes(b"\x89PNG fake")
    (tmp_path / "a.wav").write_bytes(b"RIFF fake")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.png"
    outside.write_bytes(b"x")
    f = tmp_path / "req.edn"
    f.write_text('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content '
                 '[{:vllm/type :image-url :vllm/path "cat.png"} {:vllm/type :input-audio :vllm/path "a.wav"}]}]}\n'
                 '{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content '
                 f'[{{:vllm/type :image-url :vllm/path "{outside}"}}]}}]}}\n'
                 '{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content '
                 '[{:vllm/type :image-url :vllm/path "../../etc/passwd"}]}]}\n')
    with FaultServer() as srv:
        main(["run", str(f), "--base-url", srv.base_url, "--backend", "vllm", "--no-progress", "--concurrency", "1"])
        posts = [s.json() for s in srv.seen if s.path == "/v1/chat/completions"]
    out = _records(capsys.readouterr().out)
    assert len(out) == 3 and len(posts) == 1  # the two outside the file's directory are problems, never sent
    image, audio = posts[0]["messages"][0]["content"]
    assert image == {"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                       + base64.b64encode(b"\x89PNG fake").decode()}}
    assert audio == {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF fake").decode(),
                                                            "format": "wav"}}
    for rec in out[1:]:
        [p] = rec[kw("vllm/problems")]
        assert p[kw("vllm/code")] == kw("message/media") and "outside" in p[kw("vllm/msg")]
    # passed explicitly, the outside directory is allowed
    with FaultServer() as srv:
        main(["run", str(f), "--base-url", srv.base_url, "--backend", "vllm", "--no-progress", "--media-root",
              str(tmp_path.parent)])
        assert len([s for s in srv.seen if s.path == "/v1/chat/completions"]) == 2  # /etc/passwd still refused
    capsys.readouterr()


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path) -> None:
    from kotoba_vllm import inline_local_media
    (tmp_path / "big.png").write_bytes(b"x" * 100)
    r = parts_req('{:vllm/type :image-url :vllm/path "big.png"}')
    _, problems = inline_local_media(r, [str(tmp_path)], max_bytes=99)
    assert [p.code for p in problems] == ["message/media"] and "over the 99-byte limit" in problems[0].msg
    assert ("message/media", "vllm/path") in errors(r, "vllm")  # never sent with the path unread


def test_bad_new_fields_in_a_file_are_located_and_nothing_is_sent(tmp_path, capsys) -> None:
    f = tmp_path / "bad.edn"
    f.write_text('{:vllm/endpoint :chat\n :vllm/messages [{:vllm/role :user :vllm/content "hi"}]\n'
                 ' :vllm/min-tokens "three"\n :vllm/logit-bias {50 300}\n :sglang/ebnf 1}\n')
    with FaultServer() as srv:
        main(["run", str(f), "--base-url", srv.base_url, "--backend", "vllm", "--no-progress"])
        assert not [s for s in srv.seen if s.path == "/v1/chat/completions"]
    [rec] = _records(capsys.readouterr().out)
    where = {p[kw("vllm/field")]: p[kw("vllm/where")] for p in rec[kw("vllm/problems")]}
    assert where[kw("vllm/min-tokens")] == f"{f}:3:2" and where[kw("vllm/logit-bias")] == f"{f}:4:2"
    assert where[kw("sglang/ebnf")] == f"{f}:5:2"


def test_jsonl_records_carry_both_request_ids(tmp_path, capsys) -> None:
    import json
    f = tmp_path / "in.jsonl"
    f.write_text(json.dumps({"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
                             "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}}) + "\n")
    with FaultServer(echo_id) as srv:
        main(["run", str(f), "--base-url", srv.base_url, "--backend", "vllm", "--request-ids", "--no-progress"])
    [line] = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    ours = line["kotoba"]["request_id"]
    assert ours == "c1" and line["kotoba"]["server_request_id"] == ours  # a JSONL line's custom_id is its id
    assert line["response"]["request_id"] == ours  # OpenAI's batch output: the id the server answered with
