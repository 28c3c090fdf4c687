"""The Gemma tier: a real model (Gemma 3 270M, Q4_K_M, the base model, from the gemma extra) on a
real llama-server, one server for the session, small token counts.

Real text where the tiny model babbles; Gemma's own chat template (`--jinja`); JSON-schema and
regex outputs that parse / fullmatch where the same prompt, unconstrained and greedy, does not;
llama.cpp's prefix cache (`timings.cache_n`) at work on a growing conversation; and every
server-reported figure equal to the number in the server's JSON."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from kotoba_vllm import Client
from kotoba_vllm._edn import kw, read_one as loads
from kotoba_vllm._model import to_edn

pytestmark = pytest.mark.live

GREEDY: dict[str, Any] = {"temperature": 0.0, "seed": 7}


def capturing_client(url: str) -> tuple[Client, list[dict[str, Any]]]:
    """A Client whose httpx client keeps each JSON answer exactly as the server sent it."""
    bodies: list[dict[str, Any]] = []

    def keep(response: httpx.Response) -> None:
        response.read()
        if response.headers.get("content-type", "").startswith("application/json"):
            bodies.append(json.loads(response.content))

    http = httpx.Client(event_hooks={"response": [keep]}, timeout=120.0)
    return Client(url, backend="llamacpp", http_client=http, timeout=120.0), bodies


def test_real_text(gemma_url: str) -> None:
    with Client(gemma_url, backend="llamacpp", timeout=120.0) as c:
        r = c.completion("The capital of France is", max_tokens=12, **GREEDY)
    text = r.text or ""
    words = re.findall(r"[A-Za-z]+", text)
    assert len(words) >= 4 and ("France" in text or "Paris" in text), text
    assert r.usage is not None and r.usage.completion_tokens and r.usage.completion_tokens <= 12


def test_its_own_chat_template_renders_the_turns(gemma_url: str) -> None:
    """--jinja: llama-server renders Gemma's template (turn markers), not a generic one."""
    msgs = [{"role": "user", "content": "Say hello."}]
    rendered = httpx.post(gemma_url + "/apply-template", json={"messages": msgs}, timeout=30).json()["prompt"]
    assert "<start_of_turn>user\nSay hello.<end_of_turn>\n<start_of_turn>model\n" in rendered, rendered
    with Client(gemma_url, backend="llamacpp", timeout=120.0) as c:
        r = c.chat(msgs, max_tokens=8, **GREEDY)
    assert r.text and "<start_of_turn>" not in r.text and r.choices[0].finish_reason in ("stop", "length")


CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                         "population": {"type": "integer"}},
        "required": ["name", "population"], "additionalProperties": False}
PROMPT = "Paris is a city in France. Tell me about it."


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def test_json_schema_output_parses_where_the_free_answer_does_not(gemma_url: str) -> None:
    with Client(gemma_url, backend="llamacpp", timeout=120.0) as c:
        free = c.chat([{"role": "user", "content": PROMPT}], max_tokens=40, **GREEDY).text or ""
        shaped = c.chat([{"role": "user", "content": PROMPT}], max_tokens=40, guided_json=CITY, **GREEDY).text or ""
    assert _json_or_none(free) is None, free
    obj = _json_or_none(shaped)
    assert isinstance(obj, dict) and set(obj) == {"name", "population"}, shaped
    assert isinstance(obj["name"], str) and isinstance(obj["population"], int)


ANSWER = r"(yes|no): [A-Z][a-z]{2,12}\."


def test_regex_output_fullmatches_where_the_free_answer_does_not(gemma_url: str) -> None:
    prompt = "Question: Is Paris the capital of France? Answer with yes or no and the country.\nAnswer:"
    with Client(gemma_url, backend="llamacpp", timeout=120.0) as c:
        free = c.completion(prompt, max_tokens=12, **GREEDY).text or ""
        shaped = c.completion(prompt, max_tokens=12, guided_regex=ANSWER, **GREEDY).text or ""
    assert not re.fullmatch(ANSWER, free), free
    assert re.fullmatch(ANSWER, shaped), shaped


def test_growing_conversation_is_served_from_the_prefix_cache(gemma_url: str) -> None:
    """Turns 2 and 3 re-send the transcript: the server's own cache_n counts it, and prefill is only
    the new tokens; every figure in the EDN is the number in the server's JSON."""
    client, bodies = capturing_client(gemma_url)
    msgs: list[dict[str, str]] = []
    turns = []
    with client:
        for question in ("Name a fruit.", "What colour is it?", "Where does it grow?"):
            msgs.append({"role": "user", "content": question})
            r = client.chat(msgs, max_tokens=16, **GREEDY)
            msgs.append({"role": "assistant", "content": r.text or ""})
            turns.append((r, bodies[-1]["timings"]))
    for i, (r, t) in enumerate(turns):
        edn = loads(_dumps(r))[kw("vllm/timings")]
        pre, dec, cached = edn[kw("vllm/prefill")], edn[kw("vllm/decode")], edn[kw("vllm/cached")]
        assert (pre[kw("vllm/tokens")], pre[kw("vllm/ms")], pre[kw("vllm/tokens-per-s")]) == (
            t["prompt_n"], t["prompt_ms"], t["prompt_per_second"])
        assert (dec[kw("vllm/tokens")], dec[kw("vllm/ms")]) == (t["predicted_n"], t["predicted_ms"])
        assert dec.get(kw("vllm/tokens-per-s")) == (t["predicted_per_second"] or None)  # llama.cpp's 0: not known
        assert pre[kw("vllm/provenance")] == dec[kw("vllm/provenance")] == kw("server-reported")
        assert cached[kw("vllm/tokens")] == t["cache_n"]
        if i:
            assert t["cache_n"] > 0 and t["prompt_n"] < r.usage.prompt_tokens, t  # type: ignore[union-attr]
            assert t["cache_n"] + t["prompt_n"] == r.usage.prompt_tokens  # type: ignore[union-attr]
    assert turns[2][1]["cache_n"] > turns[1][1]["cache_n"]  # the cached prefix grows with the transcript


def _dumps(r: Any) -> str:
    from kotoba_vllm._edn import dumps
    return dumps(to_edn(r))


def test_run_local_with_the_gemma_model_answers_with_real_text(tmp_path: Any) -> None:
    """The README's first command with its one flag: `run FILE --local --model gemma3-270m` starts its own
    llama-server on the quantized GGUF (the build carries no AMX, so no SIGILL) and answers."""
    import subprocess
    import sys
    from pathlib import Path

    req = tmp_path / "ask.edn"
    req.write_text('{:vllm/endpoint :completion :vllm/prompt "The capital of France is"'
                   ' :vllm/sampling {:vllm/max-tokens 6 :vllm/temperature 0.0}}\n')
    p = subprocess.run([sys.executable, "-m", "kotoba_vllm", "run", str(req), "--local", "--model", "gemma3-270m"],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    local = re.search(r";; local llama-server at (\S+)", p.stderr)
    assert local and f";; flow {local.group(1)}:" in p.stderr, p.stderr  # flow control read the server it started
    record = loads(p.stdout.strip().splitlines()[-1])
    assert kw("vllm/error") not in record, record
    text = record[kw("vllm/text")]
    assert re.search(r"[A-Za-z]{3,}", text) and "gemma-3-270m" in record[kw("vllm/model")], record
