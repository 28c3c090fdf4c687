"""Validation: DESIGN §3 ranges (inclusive), consistency, unknown keys, and per-engine support."""

from __future__ import annotations

from typing import Any

import pytest

from kotoba_vllm import ChatRequest, CompletionRequest, GenerateRequest, Message, Sampling, validate
from kotoba_vllm._edn import kw, read_forms
from kotoba_vllm._requests import request_from_edn
from kotoba_vllm._sampling import SAMPLING_TABLE

HI = (Message(role="user", content="hi"),)


def chat(**sampling: Any) -> ChatRequest:
    return ChatRequest(messages=HI, sampling=Sampling(**sampling))


def errors(req: Any, backend: str | None = None) -> list[tuple[str, str | None, str | None]]:
    return [(p.code, p.field, p.engine) for p in validate(req, backend) if p.is_error]


# (attr, lowest ok, highest ok or None, just below, just above or None) — DESIGN §3
RANGES = [
    ("temperature", 0.0, 2.0, -0.001, 2.001),
    ("top_p", 0.0, 1.0, -0.001, 1.001),
    ("top_k", -1, None, -2, None),
    ("min_p", 0.0, 1.0, -0.001, 1.001),
    ("max_tokens", 1, None, 0, None),
    ("n", 1, None, 0, None),
    ("best_of", 1, None, 0, None),
    ("presence_penalty", -2.0, 2.0, -2.001, 2.001),
    ("frequency_penalty", -2.0, 2.0, -2.001, 2.001),
    ("repetition_penalty", 0.0, None, -0.001, None),
]


@pytest.mark.parametrize("attr, lo, hi, below, above", RANGES)
def test_ranges_are_inclusive_at_both_ends(attr: str, lo: float, hi: float | None, below: float,
                                           above: float | None) -> None:
    key = "vllm/" + attr.replace("_", "-")
    assert errors(chat(**{attr: lo})) == []
    if hi is not None:
        assert errors(chat(**{attr: hi})) == []
    assert ("sampling/range", key, None) in errors(chat(**{attr: below}))  # best-of 0 is also < n
    if above is not None:
        assert errors(chat(**{attr: above})) == [("sampling/range", key, None)]


def test_every_bounded_knob_in_the_table_is_covered() -> None:
    bounded = {k.attr for k in SAMPLING_TABLE if k.lo is not None or k.hi is not None} - {"logprobs"}
    assert bounded == {r[0] for r in RANGES}


def test_out_of_range_message_names_key_value_and_range() -> None:
    [p] = validate(chat(temperature=3.5))
    assert p.to_edn() == {kw("vllm/severity"): kw("error"), kw("vllm/code"): kw("sampling/range"),
                          kw("vllm/field"): kw("vllm/temperature"),
                          kw("vllm/msg"): ":vllm/temperature = 3.5 is out of range [0.0, 2.0]"}


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_and_infinity_are_never_in_range(value: float) -> None:
    assert errors(chat(temperature=value)) == [("sampling/range", "vllm/temperature", None)]
    assert errors(chat(repetition_penalty=value)) == [("sampling/range", "vllm/repetition-penalty", None)]


def test_edn_nan_reaches_validation_as_a_range_error() -> None:
    [f] = read_forms('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "x"}] '
                     ':vllm/sampling {:vllm/temperature ##NaN}}')
    req, problems = request_from_edn(f.value, f)
    assert problems == [] and errors(req) == [("sampling/range", "vllm/temperature", None)]


def test_best_of_must_be_at_least_n() -> None:
    assert errors(chat(n=3, best_of=3)) == []
    assert errors(chat(n=3, best_of=2)) == [("sampling/best-of", "vllm/best-of", None)]
    assert errors(chat(best_of=1)) == []  # n defaults to 1


def test_one_structured_constraint_at_a_time_and_choice_not_empty() -> None:
    assert ("sampling/conflict", "vllm/guided-choice", None) in errors(chat(guided_regex="a+", guided_choice=("a",)))
    assert errors(chat(guided_choice=())) == [("sampling/empty", "vllm/guided-choice", None)]


def test_tool_message_needs_tool_call_id() -> None:
    req = ChatRequest(messages=(Message(role="tool", content="42"),))
    assert errors(req) == [("message/tool-call-id", "vllm/tool-call-id", None)]
    ok = ChatRequest(messages=(Message(role="tool", content="42", tool_call_id="c1"),))
    assert errors(ok) == []


def test_chat_needs_messages_with_content() -> None:
    assert ("request/empty", "vllm/messages", None) in errors(ChatRequest(messages=()))
    assert errors(ChatRequest(messages=(Message(role="user"),))) == [("message/content", "vllm/content", None)]


def test_unknown_keys_are_located_problems() -> None:
    text = ('{:vllm/endpoint :chat\n :vllm/messages [{:vllm/role :user :vllm/content "x"}]\n'
            ' :vllm/sampling {:vllm/temperature 0.5\n                 :vllm/temprature 0.9}\n :vllm/modle "m"}')
    [f] = read_forms(text, "typo.edn")
    req, problems = request_from_edn(f.value, f)
    assert req is None
    got = sorted((p.code, p.field, p.where) for p in problems)
    assert got == [("request/unknown-key", "vllm/modle", "typo.edn:5:2"),
                   ("request/unknown-key", "vllm/temprature", "typo.edn:4:18")]


def test_wrong_types_and_missing_keys_are_problems() -> None:
    [f] = read_forms('{:vllm/endpoint :chat :vllm/sampling {:vllm/max-tokens "16"}}', "t.edn")
    _, problems = request_from_edn(f.value, f)
    got = {(p.code, p.field) for p in problems}
    assert got == {("request/type", "vllm/max-tokens"), ("request/missing-key", "vllm/messages")}
    [g] = read_forms('{:vllm/endpoint :chatt :vllm/prompt "x"}', "t.edn")
    _, [p] = request_from_edn(g.value, g)
    assert p.code == "request/endpoint" and p.where == "t.edn:1:2"


# ------------------------------------------------------------------ per engine

def test_best_of_refused_for_vllm() -> None:
    assert errors(chat(n=1, best_of=2), "vllm") == [("engine/unsupported", "vllm/best-of", "vllm")]


def test_guided_regex_is_honoured_by_every_engine_with_structured_output() -> None:
    for backend in ("llamacpp", "vllm", "sglang"):
        assert errors(chat(guided_regex="[0-9]+"), backend) == []
    assert errors(GenerateRequest(prompt="p", sampling=Sampling(guided_regex="[0-9]+")), "llamacpp") == []


@pytest.mark.parametrize("pattern, construct", [(r"(a)\1", "back-reference to group 1"), (r"a(?=b)", "look-ahead"),
                                                (r"\bx", "word boundary"), ("(?i)yes", "case-insensitive")])
def test_a_regex_llamacpp_cannot_enforce_is_a_problem_naming_key_construct_and_engine(pattern: str,
                                                                                      construct: str) -> None:
    [p] = [p for p in validate(chat(guided_regex=pattern), "llamacpp") if p.is_error]
    assert (p.code, p.field, p.engine) == ("engine/unsupported", "vllm/guided-regex", "llamacpp")
    assert construct in p.msg and ":vllm/guided-regex" in p.msg and "llamacpp" in p.msg
    assert errors(chat(guided_regex=pattern), "vllm") == []  # vLLM's engines take it as it is


def test_an_invalid_regex_is_a_problem_for_llamacpp() -> None:
    [p] = [p for p in validate(chat(guided_regex="(unclosed"), "llamacpp") if p.is_error]
    assert p.field == "vllm/guided-regex" and "not a valid regular expression" in p.msg


def test_guided_regex_or_choice_with_a_raw_grammar_is_a_conflict_on_llamacpp() -> None:
    for attr, value in (("guided_regex", "[0-9]+"), ("guided_choice", ("a", "b"))):
        req = ChatRequest(messages=HI, sampling=Sampling(**{attr: value}), extras={"llamacpp/grammar": "root ::= \"x\""})
        key = "vllm/" + attr.replace("_", "-")
        assert errors(req, "llamacpp") == [("sampling/conflict", key, "llamacpp")]


def test_n_above_one_refused_for_llamacpp() -> None:
    assert errors(chat(n=2), "llamacpp") == [("engine/unsupported", "vllm/n", "llamacpp")]
    assert errors(chat(n=1), "llamacpp") == []
    assert errors(chat(n=2), "vllm") == []


def test_engine_extras_only_under_their_engine() -> None:
    req = ChatRequest(messages=HI, extras={"llamacpp/cache-prompt": True})
    assert errors(req, "llamacpp") == []
    assert errors(req, "vllm") == [("engine/unsupported", "llamacpp/cache-prompt", "vllm")]
    assert errors(req, "sglang") == [("engine/unsupported", "llamacpp/cache-prompt", "sglang")]
    sg = GenerateRequest(prompt="p", extras={"sglang/rid": "r1"})
    assert errors(sg, "sglang") == []
    assert errors(sg, "llamacpp") == [("engine/unsupported", "sglang/rid", "llamacpp")]


def test_extra_on_a_route_it_does_not_belong_to() -> None:
    # n_probs is a native /completion option of llama.cpp, not a chat one
    req = ChatRequest(messages=HI, extras={"llamacpp/n-probs": 3})
    assert errors(req, "llamacpp") == [("engine/unsupported", "llamacpp/n-probs", "llamacpp")]


@pytest.mark.parametrize("attr, value", [("top_k", 40), ("min_p", 0.05), ("repetition_penalty", 1.1),
                                         ("best_of", 2), ("guided_regex", "a"), ("guided_choice", ("a", "b"))])
def test_openai_generic_refuses_vllm_only_knobs(attr: str, value: Any) -> None:
    key = "vllm/" + attr.replace("_", "-")
    assert errors(chat(**{attr: value}), "openai") == [("engine/unsupported", key, "openai")]


def test_native_route_only_on_engines_that_have_one() -> None:
    g = GenerateRequest(prompt="p", sampling=Sampling(max_tokens=4))
    assert errors(g, "vllm") == [("engine/endpoint", "vllm/endpoint", "vllm")]
    assert errors(g, "openai") == [("engine/endpoint", "vllm/endpoint", "openai")]
    assert errors(g, "llamacpp") == [] and errors(g, "sglang") == []


def test_sglang_native_route_has_no_n() -> None:
    g = GenerateRequest(prompt="p", sampling=Sampling(n=2))
    assert errors(g, "sglang") == [("engine/unsupported", "vllm/n", "sglang")]


def test_problem_text_names_key_and_engine() -> None:
    [p] = [p for p in validate(chat(best_of=2), "vllm") if p.is_error]
    assert ":vllm/best-of" in p.msg and "vllm" in p.msg
    assert p.to_edn()[kw("vllm/engine")] == kw("vllm")


def test_completion_request_ranges_too() -> None:
    req = CompletionRequest(prompt="p", sampling=Sampling(max_tokens=0))
    assert errors(req) == [("sampling/range", "vllm/max-tokens", None)]


@pytest.mark.parametrize("pattern, warned", [
    (r"[A-Z]{3}-\d{4}", True),  # Unicode \d: 1-, 2-, 3- and 4-byte digits in one class
    (r"(?a)[A-Z]{3}-\d{4}", False),
    (r".{1,5}", True),
    (r'"[^"]*"', True),  # a wide negated class
    (r"[0-9a-zà-ÿ]+", False),  # 1- and 2-byte only
    (r"[ぁ-ゖ]+|é", False),  # each class within one length
    (r"[\u0800-\U00010000]", True),  # 3- and 4-byte
])
def test_llamacpp_warns_where_a_class_spans_utf8_lengths_its_grammar_cannot_police(pattern: str, warned: bool) -> None:
    warns = [p for p in validate(chat(guided_regex=pattern), "llamacpp") if not p.is_error]
    assert [(p.code, p.field) for p in warns] == ([("engine/overlong-utf8", "vllm/guided-regex")] if warned else [])
    assert errors(chat(guided_regex=pattern), "llamacpp") == []  # a warning, never a refusal
    assert [p for p in validate(chat(guided_regex=pattern), "vllm") if p.code == "engine/overlong-utf8"] == []


def test_repeated_sampling_keywords_are_checked_by_type_every_time() -> None:
    """The kwargs -> Sampling cache must not let `True` or `4.0` ride on an earlier `1` or `4`."""
    from kotoba_vllm import ValidationError
    from kotoba_vllm._base_client import sampling_from_kwargs

    first = sampling_from_kwargs({"max_tokens": 4, "temperature": 1})
    assert first is not None and sampling_from_kwargs({"max_tokens": 4, "temperature": 1}) is first
    for bad in ({"max_tokens": 4.0, "temperature": 1}, {"max_tokens": True, "temperature": 1}):
        with pytest.raises(ValidationError):
            sampling_from_kwargs(bad)
    stops = sampling_from_kwargs({"stop": ["a", "b"]})
    assert stops is not None and stops.stop == ("a", "b")


def test_a_checked_request_is_sent_after_only_the_engines_check_and_refused_with_every_problem() -> None:
    """`checked` is a value the batch reader hands on (an entry's `checked`), not state kept elsewhere:
    clean and checked, nothing is reported; when the engine refuses it, the refusal lists every
    problem, exactly as an unchecked request's."""
    import io

    from kotoba_vllm._validate import send_problems
    from kotoba_vllm.batch._entries import iter_edn_entries
    text = ('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "hi"}] '
            ':vllm/sampling {:vllm/max-tokens 4 :vllm/min-p 0.1}}\n')
    (entry,) = iter_edn_entries(io.StringIO(text), "<t>")
    assert entry.checked and entry.request is not None and entry.sendable
    assert send_problems(entry.request, "vllm", checked=True) == [] == validate(entry.request, "vllm")
    refused = send_problems(entry.request, "openai", checked=True)
    assert refused == validate(entry.request, "openai") and any(p.is_error for p in refused)
