"""The engines' own request fields (schemas/engine-fields/, read from their code) against the SDK's field
table (kotoba_vllm/_fields.py): every field is rendered by the client, or a row of the table, or left out on
purpose with a reason; and every row names a field its engine has."""

from __future__ import annotations

from pathlib import Path

import pytest

from kotoba_vllm import _fields
from kotoba_vllm._edn import kw, read_file

TABLES = Path(__file__).resolve().parent.parent / "schemas" / "engine-fields"
# (table file, engine, the routes whose every field must be accounted for)
CHECKED = (("vllm-0.33.0", "vllm", ("chat", "completion")), ("vllm-0.32.0", "vllm", ("chat", "completion")),
           ("sglang-0.5.23", "sglang", ("chat", "completion", "generate")),
           ("llamacpp-11434.0.0", "llamacpp", ("chat", "generate")))
REASONS = {_fields.DEPRECATED, _fields.INTERNAL, _fields.UNREPRESENTABLE}


def table(name: str) -> dict:
    value = read_file(str(TABLES / f"{name}.edn"))[0].value
    assert isinstance(value, dict)
    return value


def field_names(t: dict, route: str) -> list[str]:
    return [f[kw("field/name")] for f in t[kw("fields/requests")][kw(route)][kw("fields/fields")]]


def rendered_here(engine: str, route: str, name: str) -> bool:
    """A row of the table puts `name` on the wire on `route` (a dotted wire name puts its head there)."""
    for f in _fields.BY_KEY.values():
        where = f.engines.get(engine)
        if where is None:
            continue
        names = {where.wire.split(".")[0], where.native}
        # llama.cpp's OpenAI routes read its native fields; its table lists them once, under generate
        routes = where.routes | ({"chat", "completion"} & where.routes and {"generate"} if engine == "llamacpp" else set())
        if name in names and route in routes:
            return True
    return False


def unaccounted(name: str, engine: str, routes: tuple[str, ...]) -> list[str]:
    t = table(name)
    out = []
    for route in routes:
        for field in field_names(t, route):
            if _fields.own_name(engine, field) or rendered_here(engine, route, field) \
                    or field in _fields.UNSUPPORTED.get(engine, {}):
                continue
            out.append(f"{route}:{field}")
    return out


@pytest.mark.parametrize("name,engine,routes", CHECKED, ids=[c[0] for c in CHECKED])
def test_every_engine_field_is_supported_or_left_out_with_a_reason(name: str, engine: str,
                                                                   routes: tuple[str, ...]) -> None:
    assert unaccounted(name, engine, routes) == [], (
        f"{name}: fields neither rendered, nor in kotoba_vllm/_fields.py FIELDS, nor in UNSUPPORTED with a reason")


def test_sglang_sampling_params_are_accounted_for() -> None:
    t = table("sglang-0.5.23")
    names = [f[kw("field/name")] for f in t[kw("fields/sampling-params")][kw("fields/fields")]]
    from kotoba_vllm.dialects.sglang import NATIVE_NAMES, SAMPLING_PARAM_NAMES
    assert set(names) - _fields.SGLANG_SAMPLING_INTERNAL == SAMPLING_PARAM_NAMES
    sampled = {w.native or w.wire for f in _fields.BY_KEY.values() if (w := f.engines.get("sglang")) and w.sampling}
    rendered = {"temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                "repetition_penalty", "stop", "json_schema", "regex", "n", *NATIVE_NAMES.values()}
    missing = SAMPLING_PARAM_NAMES - sampled - rendered - {"beam_width", "structural_tag"}
    assert missing == set()


def test_every_reason_is_one_of_the_three() -> None:
    for engine, rows in _fields.UNSUPPORTED.items():
        for wire, (reason, why) in rows.items():
            assert reason in REASONS and why, (engine, wire)


def test_every_row_names_a_field_its_engine_has() -> None:
    """A row whose wire name the engine's table lacks would be ignored by the engine (vLLM only logs it)."""
    known = {"vllm": set(), "sglang": set(), "llamacpp": set()}
    for name, engine, _ in CHECKED:
        t = table(name)
        for route in t[kw("fields/requests")]:
            known[engine] |= set(field_names(t, route.name))
        if kw("fields/sampling-params") in t:
            known[engine] |= {f[kw("field/name")] for f in t[kw("fields/sampling-params")][kw("fields/fields")]}
    stray = [(f.key, e, o.wire) for f in _fields.BY_KEY.values() for e, o in f.engines.items()
             if e in known and o.wire.split(".")[0] not in known[e] and (o.native or "") not in known[e]]
    assert stray == []


def test_the_fields_named_in_issue_31_are_supported() -> None:
    named = {"chat_template_kwargs", "priority", "min_tokens", "ignore_eos", "skip_special_tokens", "logit_bias",
             "prompt_logprobs", "stop_token_ids", "bad_words", "allowed_token_ids", "truncate_prompt_tokens",
             "cache_salt", "parallel_tool_calls", "continuous_usage_stats", "return_tokens_as_token_ids",
             "mm_processor_kwargs", "return_hidden_states", "ebnf", "stop_regex", "no_stop_trim", "session_params",
             "separate_reasoning", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
             "dry_sequence_breakers", "xtc_probability", "xtc_threshold", "mirostat", "mirostat_tau", "mirostat_eta",
             "typical_p", "lora", "t_max_predict_ms", "n_cmpl"}
    assert named <= set(_fields.BY_KWARG) | {"continuous_usage_stats"}
    assert "continuous_usage_stats" in _fields.BY_KWARG


def test_namespaces_follow_the_rule() -> None:
    """Several engines: :vllm/*; one engine: its namespace (vLLM's is :vllm.engine/*)."""
    own = {"vllm": "vllm.engine", "sglang": "sglang", "llamacpp": "llamacpp"}
    for f in _fields.BY_KEY.values():
        engines = set(f.engines) - {"openai"}
        ns = f.key.split("/")[0]
        if len(engines) > 1:
            assert ns == "vllm", f.key
        else:
            assert ns == own[engines.pop()], f.key


def test_the_engine_pages_are_generated_from_the_tables() -> None:
    from kotoba_vllm._schema._engine_docs import DOCS_DIR, engine_docs
    for rel, text in engine_docs().items():
        path = DOCS_DIR / rel
        assert path.exists() and path.read_text(encoding="utf-8") == text, (
            f"docs/engines/{rel} differs from the tables; regenerate with `python -m kotoba_vllm._schema --write`")
