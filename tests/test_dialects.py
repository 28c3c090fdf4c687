"""Engine dialects (pure): the body each engine honours, and each engine's JSON back as typed data.

The JSON below follows each engine's documented / source-visible shapes (llama.cpp server
README and server.cpp, SGLang 0.5.x `openai_api/protocol.py` and `/generate`, vLLM's OpenAI server).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kotoba_vllm import AdmissionRejected, BadRequest, NotReady, ProtocolError, ServerFailure, get_dialect
from kotoba_vllm._edn import dumps, kw, read_one
from kotoba_vllm._errors import KotobaError
from kotoba_vllm._model import Response, to_edn
from kotoba_vllm._requests import request_from_edn
from kotoba_vllm._validate import validate
from kotoba_vllm.dialects import DIALECTS, classify_error, parse_retry_after

SAMPLING = ('{:vllm/temperature 0.5 :vllm/top-p 0.9 :vllm/max-tokens 16 :vllm/seed 7 :vllm/stop ["\\n"]'
            ' :vllm/repetition-penalty 1.1}')

def req_of(text: str) -> Any:
    req, problems = request_from_edn(read_one(text))
    assert problems == [], problems
    return req

def render(backend: str, req: Any) -> dict[str, Any]:
    assert [p for p in validate(req, backend) if p.is_error] == []
    http = get_dialect(backend).render(req)
    return {"method": http.method, "path": http.path, "body": http.body, "stream": http.stream}

def as_endpoint(endpoint: str, sampling: str = SAMPLING, extra: str = "") -> Any:
    body = ('[{:vllm/role :user :vllm/content "hi"}]' if endpoint == "chat" else '"Once"')
    key = ":vllm/messages" if endpoint == "chat" else ":vllm/prompt"
    return req_of(f"{{:vllm/endpoint :{endpoint} :vllm/model \"m\" {key} {body} :vllm/sampling {sampling} {extra}}}")

# ------------------------------------------------------------------ rendering: the Done-when

@pytest.mark.parametrize("backend", ["vllm", "sglang", "llamacpp"])
@pytest.mark.parametrize("endpoint, path", [("chat", "/v1/chat/completions"), ("completion", "/v1/completions")])
def test_openai_routes_carry_max_tokens(backend: str, endpoint: str, path: str) -> None:
    r = render(backend, as_endpoint(endpoint))
    assert (r["method"], r["path"]) == ("POST", path)
    assert r["body"]["max_tokens"] == 16 and "n_predict" not in r["body"]
    assert r["body"]["model"] == "m" and r["body"]["temperature"] == 0.5 and r["body"]["stop"] == ["\n"]

def test_openai_generic_renders_plain_openai() -> None:
    req = as_endpoint("chat", '{:vllm/temperature 0.5 :vllm/max-tokens 16}')
    assert render("openai", req)["body"] == {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                            "temperature": 0.5, "max_tokens": 16}

def test_llamacpp_native_completion_takes_n_predict() -> None:
    r = render("llamacpp", as_endpoint("generate", extra=":llamacpp/cache-prompt true :llamacpp/id-slot 1"))
    assert r["path"] == "/completion"
    assert r["body"] == {"prompt": "Once", "temperature": 0.5, "top_p": 0.9, "n_predict": 16, "seed": 7,
                         "stop": ["\n"], "repeat_penalty": 1.1, "cache_prompt": True, "id_slot": 1}

def test_llamacpp_renames_repetition_penalty_on_openai_routes_too() -> None:
    body = render("llamacpp", as_endpoint("chat"))["body"]
    assert body["repeat_penalty"] == 1.1 and "repetition_penalty" not in body

def test_sglang_generate_takes_sampling_params_max_new_tokens_and_sampling_seed() -> None:
    r = render("sglang", as_endpoint("generate"))
    assert r["path"] == "/generate"
    assert r["body"] == {"text": "Once", "sampling_params": {
        "temperature": 0.5, "top_p": 0.9, "max_new_tokens": 16, "repetition_penalty": 1.1, "stop": ["\n"],
        "sampling_seed": 7}}

def test_sglang_generate_with_token_ids_and_logprobs() -> None:
    req = req_of('{:vllm/endpoint :generate :vllm/prompt [1 2 3] :vllm/sampling {:vllm/logprobs 2}}')
    body = render("sglang", req)["body"]
    assert body["input_ids"] == [1, 2, 3] and body["return_logprob"] is True and body["top_logprobs_num"] == 2

SCHEMA = '{:type "object" :properties {:name {:type "string"}} :required ["name"]}'
SCHEMA_JSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}

@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_vllm_structured_output_goes_in_structured_outputs_never_top_level_guided(endpoint: str) -> None:
    for sampling, expected in [(f"{{:vllm/guided-json {SCHEMA}}}", {"json": SCHEMA_JSON}),
                               ('{:vllm/guided-regex "[0-9]+"}', {"regex": "[0-9]+"}),
                               ('{:vllm/guided-choice ["yes" "no"]}', {"choice": ["yes", "no"]})]:
        body = render("vllm", as_endpoint(endpoint, sampling))["body"]
        assert body["structured_outputs"] == expected
        assert not [k for k in body if k.startswith("guided_")]

def test_guided_json_given_as_a_json_string_is_sent_as_an_object_to_vllm() -> None:
    s = json.dumps(SCHEMA_JSON).replace('"', '\\"')
    body = render("vllm", as_endpoint("chat", f'{{:vllm/guided-json "{s}"}}'))["body"]
    assert body["structured_outputs"] == {"json": SCHEMA_JSON}

def test_sglang_structured_output_on_openai_routes() -> None:
    body = render("sglang", as_endpoint("chat", f"{{:vllm/guided-json {SCHEMA}}}"))["body"]
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == SCHEMA_JSON
    assert render("sglang", as_endpoint("chat", '{:vllm/guided-regex "a+"}'))["body"]["regex"] == "a+"
    assert render("sglang", as_endpoint("chat", '{:vllm/guided-choice ["a.b" "c"]}'))["body"]["regex"] == r"(a\.b|c)"

def test_sglang_generate_json_schema_is_a_json_string() -> None:
    params = render("sglang", as_endpoint("generate", f"{{:vllm/guided-json {SCHEMA}}}"))["body"]["sampling_params"]
    assert isinstance(params["json_schema"], str) and json.loads(params["json_schema"]) == SCHEMA_JSON
    params = render("sglang", as_endpoint("generate", '{:vllm/guided-regex "x+"}'))["body"]["sampling_params"]
    assert params["regex"] == "x+"

def test_llamacpp_structured_output_is_json_schema_or_grammar() -> None:
    gen = render("llamacpp", as_endpoint("generate", f"{{:vllm/guided-json {SCHEMA}}}"))["body"]
    assert gen["json_schema"] == SCHEMA_JSON
    comp = render("llamacpp", as_endpoint("completion", f"{{:vllm/guided-json {SCHEMA}}}"))["body"]
    assert comp["json_schema"] == SCHEMA_JSON
    chat = render("llamacpp", as_endpoint("chat", f"{{:vllm/guided-json {SCHEMA}}}"))["body"]
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"schema": SCHEMA_JSON}}
    choice = render("llamacpp", as_endpoint("generate", '{:vllm/guided-choice ["yes" "no"]}'))["body"]
    assert choice["grammar"] == 'root ::= "yes" | "no"'

@pytest.mark.parametrize("endpoint", ["chat", "completion", "generate"])
def test_llamacpp_guided_regex_is_a_grammar_on_every_text_route(endpoint: str) -> None:
    from _gbnf import Grammar
    body = render("llamacpp", as_endpoint(endpoint, '{:vllm/guided-regex "[a-c]{2}-\\\\d|日本"}'))["body"]
    assert "regex" not in body and "json_schema" not in body
    g = Grammar.parse(body["grammar"])
    assert g.accepts("ab-7") and g.accepts("日本") and not g.accepts("ab-") and not g.accepts("ad-7")

def test_llamacpp_choice_grammar_escapes_what_json_escaping_would_break() -> None:
    # JSON's \ud83d\ude00 surrogate pair or \b would not mean the character in GBNF
    choice = render("llamacpp", as_endpoint("chat", '{:vllm/guided-choice ["😀" "a\\"b"]}'))["body"]
    assert choice["grammar"] == 'root ::= "😀" | "a\\"b"'

def test_rendering_an_untranslatable_regex_without_validating_raises_the_problem() -> None:
    from kotoba_vllm import ValidationError
    req = req_of('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "x"}]'
                 ' :vllm/sampling {:vllm/guided-regex "(?<=a)b"}}')
    with pytest.raises(ValidationError) as e:
        get_dialect("llamacpp").render(req)
    assert e.value.problems[0].field == "vllm/guided-regex" and "look-behind" in e.value.problems[0].msg

def test_every_example_renders_or_is_refused_with_a_named_problem() -> None:
    from pathlib import Path

    from kotoba_vllm._edn import read_file
    root = Path(__file__).resolve().parent.parent / "examples"
    for path in [root / f"{n}.edn" for n in ("chat", "completion", "streaming", "structured", "regex", "tool-call")]:
        for form in read_file(str(path)):
            req, problems = request_from_edn(form.value, form)
            assert problems == [] and req is not None, (path, problems)
            for name in DIALECTS:
                errs = [p for p in validate(req, name) if p.is_error]
                if errs:
                    assert all(p.engine == name for p in errs)
                else:
                    assert get_dialect(name).render(req).body is not None

def test_streaming_asks_for_usage_and_marks_the_request() -> None:
    req = req_of('{:vllm/endpoint :chat :vllm/stream true :vllm/messages [{:vllm/role :user :vllm/content "x"}]}')
    r = render("vllm", req)
    assert r["stream"] is True and r["body"]["stream"] is True
    assert r["body"]["stream_options"] == {"include_usage": True}

def test_tool_calls_and_multipart_render_openai_shapes() -> None:
    req = req_of('''{:vllm/endpoint :chat
      :vllm/messages [{:vllm/role :user :vllm/content [{:vllm/type :text :vllm/text "what?"}
                                                       {:vllm/type :image-url :vllm/url "http://x/a.png"}]}
                      {:vllm/role :assistant :vllm/content nil
                       :vllm/tool-calls [{:vllm/id "c1" :vllm/name "f" :vllm/arguments "{}"}]}
                      {:vllm/role :tool :vllm/tool-call-id "c1" :vllm/content "42"}]
      :vllm/tools [{:type "function" :function {:name "f" :parameters {:type "object"}}}]}''')
    msgs = render("vllm", req)["body"]["messages"]
    assert msgs[0]["content"] == [{"type": "text", "text": "what?"},
                                  {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]
    assert msgs[1] == {"role": "assistant", "content": None,
                       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert msgs[2] == {"role": "tool", "content": "42", "tool_call_id": "c1"}

@pytest.mark.parametrize("backend, path, body", [
    ("llamacpp", "/tokenize", {"content": "hello"}),
    ("vllm", "/tokenize", {"prompt": "hello"}),
    ("sglang", "/tokenize", {"prompt": "hello"}),
])
def test_tokenize_per_engine(backend: str, path: str, body: dict[str, Any]) -> None:
    r = render(backend, req_of('{:vllm/endpoint :tokenize :vllm/text "hello"}'))
    assert (r["path"], r["body"]) == (path, body)

# ------------------------------------------------------------------ parsing full responses


def _chat_req() -> Any:
    return as_endpoint("chat")

VLLM_CHAT = {
    "id": "chatcmpl-9a", "object": "chat.completion", "created": 1764460000, "model": "Qwen/Qwen2.5-0.5B",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!", "reasoning_content": None,
                                         "tool_calls": []},
                 "logprobs": None, "finish_reason": "stop", "stop_reason": None}],
    "usage": {"prompt_tokens": 8, "total_tokens": 10, "completion_tokens": 2,
              "prompt_tokens_details": {"cached_tokens": 4}},
    "prompt_logprobs": None, "kv_transfer_params": None}

def test_vllm_chat_response_normalized() -> None:
    r = get_dialect("vllm").parse(_chat_req(), VLLM_CHAT, "http://h:8000/v1/chat/completions")
    assert isinstance(r, Response)
    assert (r.text, r.finish_reason, r.id, r.model, r.backend) == ("Hello!", "stop", "chatcmpl-9a",
                                                                   "Qwen/Qwen2.5-0.5B", "vllm")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens, r.usage.cached_tokens) == \
        (8, 2, 10, 4)
    assert r.endpoint_url == "http://h:8000/v1/chat/completions"
    edn = r.to_edn() if hasattr(r, "to_edn") else __import__("kotoba_vllm").to_edn(r)
    assert edn[kw("vllm/usage")][kw("vllm/prompt-tokens")] == 8
    assert edn[kw("vllm/choices")][0][kw("vllm/finish-reason")] == kw("stop")

def test_tool_call_response_parsed() -> None:
    obj = {"id": "x", "model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": "{\"city\": \"Kyoto\"}"}}]}}]}
    r = get_dialect("vllm").parse(_chat_req(), obj)
    [t] = r.choices[0].tool_calls
    assert (t.id, t.name, t.arguments) == ("call_1", "get_weather", '{"city": "Kyoto"}')
    assert r.finish_reason == "tool_calls"

LLAMA_TIMINGS = {"cache_n": 3, "prompt_n": 5, "prompt_ms": 2.5, "prompt_per_token_ms": 0.5,
                 "prompt_per_second": 2000.0, "predicted_n": 4, "predicted_ms": 8.0,
                 "predicted_per_token_ms": 2.0, "predicted_per_second": 500.0}

def test_llamacpp_openai_chat_keeps_timings_as_server_reported_prefill_and_decode() -> None:
    obj = {"choices": [{"finish_reason": "length", "index": 0, "message": {"role": "assistant", "content": "abcd"}}],
           "created": 1764460000, "model": "tiny", "system_fingerprint": "b0-unknown", "object": "chat.completion",
           "usage": {"completion_tokens": 4, "prompt_tokens": 8, "total_tokens": 12}, "id": "chatcmpl-x",
           "timings": LLAMA_TIMINGS}
    r = get_dialect("llamacpp").parse(_chat_req(), obj)
    assert r.timings.prefill.provenance == "server-reported" and r.timings.prefill.tokens == 5
    assert r.timings.prefill.ms == 2.5 and r.timings.prefill.tokens_per_s == 2000.0
    assert r.timings.decode.provenance == "server-reported" and r.timings.decode.tokens == 4
    assert r.timings.decode.tokens_per_s == 500.0
    assert r.timings.cached.tokens == 3
    assert r.system_fingerprint == "b0-unknown"
    assert r.extras["llamacpp/timings"][kw("prompt_n")] == 5

def test_llamacpp_native_completion_parsed() -> None:
    obj = {"index": 0, "content": " there was", "tokens": [], "id_slot": 0, "stop": True, "model": "tiny",
           "tokens_predicted": 4, "tokens_evaluated": 5, "generation_settings": {"n_predict": 4},
           "prompt": "<s> Once upon a time", "has_new_line": False, "truncated": False, "stop_type": "limit",
           "stopping_word": "", "tokens_cached": 8, "timings": LLAMA_TIMINGS}
    r = get_dialect("llamacpp").parse(as_endpoint("generate"), obj, "http://h/completion")
    assert (r.text, r.finish_reason, r.endpoint) == (" there was", "length", "generate")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.cached_tokens) == (5, 4, 3)
    assert r.timings.decode.provenance == "server-reported" and r.timings.decode.ms == 8.0
    assert r.extras["llamacpp/stop-type"] == "limit" and r.extras["llamacpp/id-slot"] == 0

def test_sglang_generate_parsed() -> None:
    obj = {"text": " there was a", "meta_info": {
        "id": "5b3c", "finish_reason": {"type": "length", "length": 16}, "prompt_tokens": 5,
        "completion_tokens": 16, "cached_tokens": 1, "e2e_latency": 0.21}}
    r = get_dialect("sglang").parse(as_endpoint("generate"), obj)
    assert (r.text, r.finish_reason, r.id) == (" there was a", "length", "5b3c")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (5, 16, 21)
    assert r.extras["sglang/meta-info"][kw("e2e_latency")] == 0.21

def test_a_response_without_choices_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError) as ei:
        get_dialect("vllm").parse(_chat_req(), {"id": "x"})
    assert '"id"' in (ei.value.offending or "")

def test_models_list_parsed() -> None:
    obj = {"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "llamacpp",
                                       "max_model_len": 2048}]}
    m = get_dialect("llamacpp").parse_models(obj, "http://h/v1/models")
    assert [(x.id, x.owned_by, x.max_model_len) for x in m.models] == [("tiny", "llamacpp", 2048)]

def test_tokenize_answers_parsed() -> None:
    d = get_dialect("llamacpp")
    tok = req_of('{:vllm/endpoint :tokenize :vllm/text "hi"}')
    assert d.parse(tok, {"tokens": [1, 2]}).tokens == (1, 2)
    assert d.parse(tok, {"tokens": [{"id": 1, "piece": "h"}]}).tokens == (1,)
    detok = req_of('{:vllm/endpoint :detokenize :vllm/tokens [1 2]}')
    assert d.parse(detok, {"content": "hi"}).text == "hi"
    assert get_dialect("vllm").parse(detok, {"prompt": "hi"}).text == "hi"

# ------------------------------------------------------------------ streams

def feed_all(backend: str, req: Any, payloads: list[str]) -> tuple[list[Any], Any]:
    dec = get_dialect(backend).stream_decoder(req, "http://h/x")
    deltas = [d for p in payloads for d in dec.feed(p)]
    return deltas, dec

def test_openai_chat_stream_with_usage_chunk() -> None:
    chunks = [
        {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
        {"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}},
    ]
    deltas, dec = feed_all("vllm", _chat_req(), [json.dumps(c) for c in chunks] + ["[DONE]"])
    assert [d.delta for d in deltas] == ["Hel", "lo"] and deltas[-1].finish_reason == "stop"
    assert dec.done
    r = dec.response()
    assert r.text == "Hello" and r.usage.total_tokens == 5 and r.id == "c1"

def test_streamed_tool_call_fragments_are_assembled() -> None:
    chunks = [
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                            "function": {"name": "get_", "arguments": ""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "weather",
                                                                                     "arguments": "{\"ci"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "ty\": 1}"}}]},
                      "finish_reason": "tool_calls"}]},
    ]
    _, dec = feed_all("vllm", _chat_req(), [json.dumps(c) for c in chunks])
    [t] = dec.response().choices[0].tool_calls
    assert (t.id, t.name, t.arguments) == ("call_1", "get_weather", '{"city": 1}')

def test_sglang_cumulative_generate_stream_yields_derived_deltas() -> None:
    def chunk(text: str, fr: Any = None) -> str:
        return json.dumps({"text": text, "meta_info": {"id": "r1", "finish_reason": fr, "prompt_tokens": 4,
                                                       "completion_tokens": len(text.split()),
                                                       "cached_tokens": 0}})
    payloads = [chunk("Once"), chunk("Once upon"), chunk("Once upon a"),
                chunk("Once upon a time", {"type": "stop", "matched": 2}), "[DONE]"]
    deltas, dec = feed_all("sglang", as_endpoint("generate"), payloads)
    assert [d.delta for d in deltas] == ["Once", " upon", " a", " time"]
    assert deltas[-1].finish_reason == "stop"
    r = dec.response()
    assert r.text == "Once upon a time" and r.id == "r1" and r.usage.prompt_tokens == 4

def test_sglang_incremental_stream_is_detected_and_concatenated() -> None:
    payloads = [json.dumps({"text": t, "meta_info": {"finish_reason": None}}) for t in ("ab", "cd", "ef")]
    deltas, dec = feed_all("sglang", as_endpoint("generate"), payloads)
    assert [d.delta for d in deltas] == ["ab", "cd", "ef"] and dec.partial_text == "abcdef"


def _gen_chunk(text: str, ids: list[int], done: int, fr: Any = None) -> str:
    return json.dumps({"text": text, "output_ids": ids,
                       "meta_info": {"id": "r", "finish_reason": fr, "prompt_tokens": 5, "completion_tokens": done}})


def test_sglang_incremental_stream_that_repeats_its_text_keeps_every_piece() -> None:
    """--incremental-streaming-output: " one", " one", " two" is three pieces, not a cumulative
    stream that stood still; the chunk's output_ids (fewer than completion_tokens) say so."""
    payloads = [_gen_chunk(" one", [7], 1), _gen_chunk(" one", [7], 2), _gen_chunk(" two", [8], 3, {"type": "length"})]
    deltas, dec = feed_all("sglang", as_endpoint("generate"), payloads)
    assert [d.delta for d in deltas] == [" one", " one", " two"] and dec.response().text == " one one two"


def test_sglang_cumulative_stream_is_read_from_the_counts_too() -> None:
    payloads = [_gen_chunk(" one", [7], 1), _gen_chunk(" one one", [7, 7], 2),
                _gen_chunk(" one one two", [7, 7, 8], 3, {"type": "length"})]
    deltas, dec = feed_all("sglang", as_endpoint("generate"), payloads)
    assert [d.delta for d in deltas] == [" one", " one", " two"] and dec.response().text == " one one two"


@pytest.mark.parametrize("fr,cls,reason", [
    ({"type": "abort", "status_code": 503, "message": "The request queue is full."}, AdmissionRejected, "queue-full"),
    ({"type": "abort", "status_code": 400, "message": "bad"}, BadRequest, None),
    ({"type": "abort", "status_code": 503, "message": "The request is aborted by a higher priority request."},
     ServerFailure, None),
    ({"type": "abort", "message": "Abort in waiting queue"}, ServerFailure, None),
])
def test_sglang_abort_finish_reason_is_a_typed_error(fr: Any, cls: type, reason: Any) -> None:
    """SGLang's scheduler ends a request with finish_reason type abort: an error, never an empty answer."""
    dec = get_dialect("sglang").stream_decoder(as_endpoint("generate"), "http://h/generate")
    dec.feed(_gen_chunk(" one", [7], 1))
    with pytest.raises(cls) as ei:
        dec.feed(_gen_chunk(" one", [7], 1, fr))
    assert type(ei.value) is cls and ei.value.partial_text == " one" and ei.value.message == fr["message"]
    assert getattr(ei.value, "reason", None) == reason and ei.value.status == fr.get("status_code")
    with pytest.raises(cls):
        get_dialect("sglang").parse(as_endpoint("generate"), json.loads(_gen_chunk("", [], 0, fr)), "http://h/generate")

def test_llamacpp_native_stream_final_chunk_carries_server_timings() -> None:
    payloads = [json.dumps({"index": 0, "content": c, "tokens": [1], "stop": False, "id_slot": -1,
                            "tokens_predicted": i + 1, "tokens_evaluated": 5}) for i, c in enumerate(["He", "llo"])]
    payloads.append(json.dumps({"index": 0, "content": "", "tokens": [], "id_slot": 0, "stop": True, "model": "tiny",
                                "tokens_predicted": 2, "tokens_evaluated": 5, "stop_type": "limit",
                                "stopping_word": "", "tokens_cached": 7, "truncated": False,
                                "timings": LLAMA_TIMINGS}))
    deltas, dec = feed_all("llamacpp", as_endpoint("generate"), payloads)
    assert [d.delta for d in deltas] == ["He", "llo", ""] and deltas[-1].finish_reason == "length"
    # the Clojure library's shape: the last delta has no text, so :vllm/delta is nil there
    assert to_edn(deltas[-1]) == {kw("vllm/delta"): None, kw("vllm/finish-reason"): kw("length"), kw("vllm/index"): 0}
    assert to_edn(deltas[0])[kw("vllm/finish-reason")] is None
    assert dec.done
    r = dec.response()
    assert r.text == "Hello" and r.usage.completion_tokens == 2
    assert r.timings.prefill.provenance == "server-reported" and r.timings.prefill.ms == 2.5
    assert r.timings.decode.provenance == "server-reported" and r.timings.decode.ms == 8.0

def test_llamacpp_openai_stream_final_chunk_timings() -> None:
    payloads = [
        json.dumps({"choices": [{"finish_reason": None, "index": 0, "delta": {"content": "ab"}}], "id": "c",
                    "model": "tiny", "object": "chat.completion.chunk"}),
        json.dumps({"choices": [{"finish_reason": "length", "index": 0, "delta": {}}], "id": "c",
                    "object": "chat.completion.chunk",
                    "usage": {"completion_tokens": 4, "prompt_tokens": 5, "total_tokens": 9},
                    "timings": LLAMA_TIMINGS}),
        "[DONE]"]
    _, dec = feed_all("llamacpp", _chat_req(), payloads)
    r = dec.response()
    assert r.timings.decode.provenance == "server-reported" and r.timings.decode.tokens_per_s == 500.0

def test_error_object_inside_a_stream_is_a_typed_error_with_partial_text() -> None:
    dec = get_dialect("vllm").stream_decoder(_chat_req(), "http://h/x")
    dec.feed(json.dumps({"choices": [{"index": 0, "delta": {"content": "par"}}]}))
    with pytest.raises(ServerFailure) as ei:
        dec.feed(json.dumps({"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}))
    assert ei.value.partial_text == "par" and ei.value.message == "engine died"

def test_sglang_queue_full_inside_a_200_stream_is_admission() -> None:
    dec = get_dialect("sglang").stream_decoder(as_endpoint("generate"), "http://h/generate")
    with pytest.raises(AdmissionRejected) as ei:
        dec.feed(json.dumps({"error": {"object": "error", "message": "The request queue is full.",
                                       "type": "ServiceUnavailable", "param": None, "code": 503}}))
    assert ei.value.reason == "queue-full"

def test_malformed_stream_chunk_keeps_offending_text() -> None:
    dec = get_dialect("llamacpp").stream_decoder(as_endpoint("generate"), "http://h/completion")
    dec.feed(json.dumps({"content": "ok", "stop": False}))
    with pytest.raises(ProtocolError) as ei:
        dec.feed('{"content": "broken')
    assert ei.value.offending == '{"content": "broken' and ei.value.partial_text == "ok"

# ------------------------------------------------------------------ error bodies

def _cls(status: int, body: Any, headers: dict[str, str] | None = None) -> KotobaError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return classify_error(status, raw, headers or {}, "http://h/v1/chat/completions")

def test_llamacpp_exceed_context_error_kept_whole() -> None:
    e = _cls(400, {"error": {"code": 400, "message": "the request exceeds the available context size",
                             "type": "exceed_context_size_error", "n_prompt_tokens": 21026, "n_ctx": 512}})
    assert isinstance(e, BadRequest)
    assert e.error_type == "exceed_context_size_error" and e.status == 400
    assert e.details[kw("n_prompt_tokens")] == 21026 and e.details[kw("n_ctx")] == 512
    edn = e.to_edn()
    assert edn[kw("vllm/error")] == kw("bad-request") and "exceed_context_size_error" in edn[kw("vllm/raw-body")]

def test_llamacpp_loading_is_not_ready() -> None:
    e = _cls(503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
    assert isinstance(e, NotReady) and not isinstance(e, AdmissionRejected)

def test_sglang_503_queue_full_is_admission() -> None:
    e = _cls(503, {"object": "error", "message": "The request queue is full.", "type": "ServiceUnavailable",
                   "param": None, "code": 503})
    assert isinstance(e, AdmissionRejected) and e.reason == "queue-full" and e.status == 503

def test_vllm_validation_error_body() -> None:
    e = _cls(400, {"object": "error", "message": "max_tokens must be at least 1, got 0.",
                   "type": "BadRequestError", "param": None, "code": 400})
    assert isinstance(e, BadRequest) and e.message == "max_tokens must be at least 1, got 0."
    assert e.error_type == "BadRequestError"

def test_429_reason_and_retry_after() -> None:
    e = _cls(429, {"error": {"message": "slow down", "type": "rate_limit_exceeded"}}, {"retry-after": "7"})
    assert isinstance(e, AdmissionRejected) and e.retry_after_s == 7.0 and e.reason == "rate_limit_exceeded"
    edn = e.to_edn()
    assert edn[kw("vllm/retry-after-s")] == 7.0 and edn[kw("vllm/reason")] == kw("rate_limit_exceeded")


@pytest.mark.parametrize("said", ["Too Many Requests", "1st_stop", "a:b"])
def test_429_reason_that_is_no_keyword_stays_the_servers_string(said: str) -> None:
    e = _cls(429, {"error": {"message": "slow down", "type": said}})
    assert isinstance(e, AdmissionRejected) and e.reason == said
    assert read_one(dumps(e.to_edn()))[kw("vllm/reason")] == said

def test_non_json_5xx_body_kept() -> None:
    e = _cls(502, b"<html>Bad Gateway</html>")
    assert isinstance(e, ServerFailure) and "Bad Gateway" in e.message and "Bad Gateway" in (e.raw_body or "")

def test_retry_after_forms() -> None:
    import datetime as dt
    now = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.timezone.utc)
    assert parse_retry_after("7", now) == 7.0
    assert parse_retry_after("Mon, 30 Nov 2026 12:00:30 GMT", now) == 30.0
    assert parse_retry_after("Mon, 30 Nov 2026 11:00:00 GMT", now) == 0.0  # past: now, never negative
    assert parse_retry_after("soon", now) is None and parse_retry_after(None, now) is None
    assert parse_retry_after("-3", now) is None


# ------------------------------------------------------------------ any engine JSON -> readable EDN

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kotoba_vllm._codec import json_to_edn  # noqa: E402
from kotoba_vllm._edn import dumps  # noqa: E402

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=15)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_any_engine_json_becomes_edn_that_reads_back(v: Any) -> None:
    # e.g. logprobs keyed by token text ("日", " the"), extras with odd keys
    e = json_to_edn(v)
    assert read_one(dumps(e)) == e


@settings(max_examples=150, deadline=None)
@given(st.integers(400, 599), json_values.map(lambda v: json.dumps({"error": v}).encode()) | st.binary(max_size=64))
def test_any_error_answer_becomes_readable_edn(status: int, raw: bytes) -> None:
    e = classify_error(status, raw, {}, "http://h/x")
    edn = e.to_edn()
    assert read_one(dumps(edn)) == edn


from _strategies import request_maps  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(request_maps, st.sampled_from(sorted(DIALECTS)))
def test_a_request_an_engine_accepts_renders_to_strict_json(m: Any, backend: str) -> None:
    m = {k: v for k, v in m.items() if k.namespace == "vllm"}  # random engine extras would be refused
    req, problems = request_from_edn(m)
    assert problems == [] and req is not None
    if any(p.is_error for p in validate(req, backend)):
        return
    http = get_dialect(backend).render(req)
    assert http.method in ("POST", "GET") and http.path.startswith("/")
    json.dumps(http.body, allow_nan=False)  # what goes on the wire is strict JSON
    assert http.stream == bool(req.stream)


@pytest.mark.parametrize(("said", "edn"), [("stop", "stop"), ("tool_calls", "tool_calls"),
                                          ("content_filter", "content_filter"), ("stop sequence", None),
                                          ("1st_stop", None)])
def test_finish_reason_keeps_the_servers_spelling(said: str, edn: str | None) -> None:
    r = get_dialect("vllm").parse(_chat_req(), {"id": "x", "model": "m", "choices": [
        {"index": 0, "finish_reason": said, "message": {"role": "assistant", "content": "hi"}}]})
    assert r.finish_reason == said
    written = dumps(to_edn(r))
    back = read_one(written)[kw("vllm/choices")][0][kw("vllm/finish-reason")]
    assert back == (kw(edn) if edn else said)
