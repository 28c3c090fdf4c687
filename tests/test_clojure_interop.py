"""EDN against the real Clojure reader: what clojure.edn reads, we read the same, or we refuse.

One JVM serves the module (the `clojure` fixture, tests/_clojure.py). Values are compared as
type-tagged dumps, so a keyword never passes for a string, nor a list for a vector, nor 1N for 1.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _clojure import Clojure, canonical, canonical_forms
from _strategies import edn_values, request_maps, responses, stream_deltas
from kotoba_vllm import AdmissionRejected
from kotoba_vllm._edn import WHITESPACE, EdnError, Keyword, dumps, kw, read_all, read_one
from kotoba_vllm._model import to_edn
from kotoba_vllm._requests import request_from_edn
from kotoba_vllm.cli import main
from kotoba_vllm.dialects import classify_error, get_dialect

pytestmark = pytest.mark.clojure

ROOT = Path(__file__).resolve().parent.parent
CHAT = read_one('{:vllm/endpoint :chat :vllm/model "m" :vllm/messages [{:vllm/role :user :vllm/content "hi"}]}')
PROJECT_EDN = sorted(p for d in ("schemas", "examples", "tests/cassettes") for p in (ROOT / d).rglob("*.edn"))


def ours(text: str) -> str:
    """Our reader's answer in the probe's terms: "ok <dumps>" or "err <message>"."""
    try:
        return canonical_forms(read_all(text))
    except EdnError as e:
        return f"err {e.msg}"


def same_or_refused(clojure: Clojure, text: str) -> tuple[str, str]:
    """Never a different value: when we read `text`, Clojure reads the very same forms."""
    mine, theirs = ours(text), clojure.read(text)
    if mine.startswith("ok"):
        assert mine == theirs, f"we read {text!r} differently from clojure.edn"
    return mine, theirs


def test_whitespace_is_clojures(clojure: Clojure) -> None:
    expanded = set(re.findall(f"[{WHITESPACE}]", "".join(map(chr, range(0x10000)))))
    assert {ord(c) for c in expanded} == set(clojure.whitespace())


# Forms Clojure's printer and REPL produce, and the silent misreads: each must read as Clojure reads it.
READ_LIKE_CLOJURE = [
    '"smile \\uD83D\\uDE00"',                       # a surrogate pair is one character
    '"\\uDE00\\uD83D"',                             # reversed: two lone surrogates, as in Java
    "\\o101", "\\o0", "\\o377", "\\formfeed", "\\backspace", "\\newline", "\\return", "\\space", "\\tab",
    "\\u00e9", "\\uFFFF", "\\u", "\\o", "\\(", "\\]", "\\;", "\\\\", '\\"', "\\#", "\\^", "\\,",
    "[\\a\\b]", "[\\a]", "\\\x00", "\\\x1c", "\\\u00a0", "\\\u3000",
    '"\\101B"', '"\\0"', '"\\7 "', '"\\12("', '"\\b\\f"',
    "#:vllm{:endpoint :chat :model \"m\"}",
    "#:vllm{:endpoint :chat :_/plain 1 :other/k 2 \"s\" 3}",
    "#:vllm {:a 1}", "#:vllm,{:a 1}", "#: vllm{:a 1}", "#:vllm{}", "[#:a{:b #:c{:d 1}}]",
    "#:vllm{a 1 _/b 2}",
    "^{:doc \"x\"} {:vllm/endpoint :chat}", "^:private [1 2]", "^String (1)", "^\"s\" #{1}",
    "#^:m [1]", "^:a ^:b sym", "[a^:m b]", "^{:a 1} #:vllm{:x 1}",
    "; a comment\r:after-cr", "[1\u3000 2]", "[1\u2028 2]",
    "1N", "0N", "-0", "+1", "1.0M", "1M", "1.M", "1e5M", "-0.0", "1.", "1e400", "9223372036854775808",
    "-9223372036854775809", "9223372036854775807",
    "##Inf", "##-Inf", "##NaN", "## Inf", "###_x NaN",
    "#inst \"2026-11-30T12:00:00.123Z\"", "#inst \"2026-11-30T12:00:00-05:30\"", "#inst \"2026\"",
    "#inst \"2026-11-30T12:00:00.123456789Z\"", "#inst #_x \"2026-01\"",
    "#uuid \"0123abcd-4567-89ab-cdef-0123456789AB\"",
    ":a.b/c-d", ":-a", ":<=>", ":a'b", ":a#b", "a/-1", "-", "+", "/", ".5", ":nil", "nil/x",
    "#{:a \"a\" \\a}", "{:a [1 (2 #{3})]}", "#_ #_ 1 2 3", "(#_1)",
]


@pytest.mark.parametrize("text", READ_LIKE_CLOJURE)
def test_reads_what_clojure_reads_the_same(clojure: Clojure, text: str) -> None:
    mine, theirs = same_or_refused(clojure, text)
    assert theirs.startswith("ok"), f"the case itself is wrong: Clojure says {theirs}"
    assert mine.startswith("ok"), f"we refuse {text!r}: {mine}"


# What clojure.edn refuses (or reads as something else entirely): refused here, with a position.
REFUSED_LIKE_CLOJURE = [
    "\\abc", "\\u00e9x", "\\uD83D", "\\o400", "\\o0000", "\\oa", "\\\U0001F600", "\\newlinex",
    ":a:", "a:", ":a::b", "a/1", ":a/1", "::a", "#::{:a 1}", "#:a/b{:c 1}", "#:1{}", "#:a [1]",
    "#:a ;c\n{:b 1}", "#:a{:b 1 :a/b 2}",
    "^:m 1", "^:m \"s\"", "^:m :k", "^1 [1]", "^:m", "#inst#_x \"2026\"",
    '"\\1x"', '"\\8"', '"\\400"', '"\\u12"', '"\\q"',
    "{:a 1 :a 2}", "#{1 1}", "{1N :a 1 :b}", "#foo 1", "#<x>", "#=(+ 1 2)", "#'a", "#\"re\"",
    "#inst \"2026-13-01\"", "#inst \"2026-11-30 12:00\"", "#uuid \"{0123abcd-4567-89ab-cdef-0123456789ab}\"",
    "@a", "a@b", "~a", "`a", "1/2", "0x10", "010", "1.5N", "(", "]", "{:a}", '"open',
]


@pytest.mark.parametrize("text", REFUSED_LIKE_CLOJURE)
def test_refuses_with_a_position(clojure: Clojure, text: str) -> None:
    mine, theirs = same_or_refused(clojure, text)
    assert mine.startswith("err"), f"we read {text!r} as {mine}; Clojure says {theirs}"
    with pytest.raises(EdnError) as ei:
        read_all(text, "f.edn")
    assert str(ei.value).startswith("f.edn:1:")


def test_auto_resolved_namespaced_map_is_refused_clearly() -> None:
    with pytest.raises(EdnError, match="namespace") as ei:
        read_all('{:a 1}\n  #::{:b 2}', "req.edn")
    assert (ei.value.line, ei.value.column) == (2, 3)


# ------------------------------------------------------------------ the project's own EDN


@pytest.mark.parametrize("path", PROJECT_EDN, ids=lambda p: str(p.relative_to(ROOT)))
def test_clojure_reads_every_project_file_as_we_do(clojure: Clojure, path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    mine, theirs = same_or_refused(clojure, text)
    assert mine.startswith("ok") and theirs.startswith("ok"), (mine[:200], theirs[:200])


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    main(list(argv))
    return capsys.readouterr().out


EXAMPLE_REQUESTS = ("batch", "chat", "completion", "streaming", "structured", "tool-call")


@pytest.mark.parametrize("backend", ["openai", "vllm", "sglang", "llamacpp"])
def test_clojure_reads_render_and_validate_output(clojure: Clojure, capsys: pytest.CaptureFixture[str],
                                                  backend: str) -> None:
    files = [str(ROOT / "examples" / f"{n}.edn") for n in EXAMPLE_REQUESTS]
    for argv in (["render", *files, "-b", backend], ["validate", *files, "-b", backend]):
        out = _cli(capsys, *argv)
        assert out.strip(), argv
        mine, theirs = same_or_refused(clojure, out)
        assert mine.startswith("ok"), (argv, mine)


def test_clojure_reads_plan_output(clojure: Clojure, capsys: pytest.CaptureFixture[str]) -> None:
    for spec in sorted((ROOT / "examples" / "distributed").glob("*.edn")):
        out = _cli(capsys, "plan", str(spec))
        mine, _ = same_or_refused(clojure, out)
        assert mine.startswith("ok"), (spec, mine)


def test_clojure_reads_capacity_of_an_unreachable_server(clojure: Clojure, capsys: pytest.CaptureFixture[str],
                                                         unused_tcp_port: int) -> None:
    out = _cli(capsys, "capacity", f"http://127.0.0.1:{unused_tcp_port}", "-b", "llamacpp", "--timeout", "1")
    mine, _ = same_or_refused(clojure, out)
    assert mine.startswith("ok") and "capacity-unmeasured" in out


@pytest.mark.live
def test_clojure_reads_run_and_bench_output(clojure: Clojure, capsys: pytest.CaptureFixture[str],
                                            llama_url: str, tmp_path: Path) -> None:
    """A real llama-server's gibberish (odd Unicode, byte fragments) through run, run --stream and bench."""
    chat = str(ROOT / "examples" / "chat.edn")
    for argv in (["run", chat, "--base-url", llama_url, "--no-progress"],
                 ["run", str(ROOT / "examples" / "streaming.edn"), "--base-url", llama_url, "--stream",
                  "--no-progress"],
                 ["run", str(ROOT / "examples" / "batch.edn"), "--base-url", llama_url, "--no-progress",
                  "--summary", str(tmp_path / "summary.edn")],
                 ["capacity", llama_url, "-b", "llamacpp"]):
        out = _cli(capsys, *argv)
        mine, _ = same_or_refused(clojure, out)
        assert mine.startswith("ok") and mine != "ok", (argv, mine[:300])
    _cli(capsys, "bench", "--base-url", llama_url, "--requests", "2", "--max-tokens", "4", "--quiet",
         "-o", str(tmp_path / "bench.edn"))  # its stdout is a table for people; the EDN report is the file
    for written in ("summary.edn", "bench.edn"):
        mine, _ = same_or_refused(clojure, (tmp_path / written).read_text(encoding="utf-8"))
        assert mine.startswith("ok") and mine != "ok", written


# ------------------------------------------------------------------ what Clojure writes


@pytest.mark.parametrize("seed", range(4))
def test_we_read_what_clojure_pr_str_writes(clojure: Clojure, seed: int) -> None:
    """A generated corpus (all of Unicode, every char form, #:vllm{} maps, metadata, big numbers,
    sets, nested engine extras), printed by Clojure: 0 misreads and 0 refusals."""
    corpus = clojure.generate(seed, 250)
    assert len(corpus) >= 200
    misread, refused = [], []
    for text, dump in corpus:
        mine = ours(text)
        if mine.startswith("err"):
            refused.append((text, mine))
        elif mine != "ok " + dump:
            misread.append(text)
    assert misread == [] and refused == []
    joined = "\n".join(t for t, _ in corpus)
    for form in ("#:vllm{", "^{", "N", "M", "\\formfeed", "\\backspace", "#inst", "#{"):
        assert form in joined, f"the corpus never printed {form}"


# ------------------------------------------------------------------ a mutated corpus

_PIECES = re.compile(r'"(?:[^"\\]|\\.)*"|\\.[^\s,"();\[\]{}\\^]*|#[{_:^]?|[\[\](){}^]|[^\s,"();\[\]{}\\^#]+|\s+|.',
                     re.DOTALL)


def _mutations(text: str, rnd: random.Random, n: int) -> list[str]:
    pieces = _PIECES.findall(text)
    slots = [i for i, p in enumerate(pieces) if not p.isspace()]
    out = []
    for _ in range(n):
        if len(slots) < 2:
            break
        i = rnd.choice(slots)
        how = rnd.randrange(3)
        copy = list(pieces)
        if how == 0:
            copy[i] = ""
        elif how == 1:
            copy[i] = copy[i] + rnd.choice(["", " "]) + copy[i]
        else:
            j = slots[(slots.index(i) + 1) % len(slots)]
            copy[i], copy[j] = copy[j], copy[i]
        out.append("".join(copy))
    return out


def test_we_never_accept_what_clojure_rejects(clojure: Clojure) -> None:
    rnd = random.Random(16)
    sources = [t for t, _ in clojure.generate(99, 120)]
    sources += [p.read_text(encoding="utf-8") for p in ROOT.glob("examples/*.edn")]
    sources += READ_LIKE_CLOJURE
    checked = accepted_by_both = 0
    for src in sources:
        for text in _mutations(src, rnd, 8):
            mine, theirs = same_or_refused(clojure, text)  # asserts: never a different value
            checked += 1
            if mine.startswith("ok"):
                assert theirs.startswith("ok"), f"we accept {text!r}; Clojure: {theirs}"
                accepted_by_both += 1
    assert checked > 1000 and accepted_by_both > 100


# ------------------------------------------------------------------ what we write


def _both_read_back(clojure: Clojure, value: Any) -> None:
    text = dumps(value)
    assert canonical(read_one(text)) == canonical(value)
    assert clojure.read(text) == "ok " + canonical(value)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.one_of(responses.map(to_edn), stream_deltas.map(to_edn), request_maps, edn_values))
def test_what_the_sdk_writes_both_readers_read_back(clojure: Clojure, value: Any) -> None:
    _both_read_back(clojure, value)


@pytest.mark.parametrize("said", ["stop sequence", "Too Many Requests", "1st_stop", "tool_calls", "stop"])
def test_server_words_read_back_as_the_server_said_them(clojure: Clojure, said: str) -> None:
    r = get_dialect("vllm").parse(request_from_edn(CHAT)[0], {
        "id": "x", "model": "m", "choices": [{"index": 0, "finish_reason": said,
                                               "message": {"role": "assistant", "content": "hi"}}]})
    e = classify_error(429, f'{{"error": {{"message": "slow", "type": "{said}"}}}}'.encode(), {}, "http://h")
    assert isinstance(e, AdmissionRejected)
    for value, key in ((to_edn(r)[kw("vllm/choices")][0], "vllm/finish-reason"), (e.to_edn(), "vllm/reason")):
        back = read_one(dumps(value))[kw(key)]
        assert (back.name if isinstance(back, Keyword) else back) == said
        _both_read_back(clojure, value)


_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
_json = st.recursive(_json_scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c,
                                                                                        max_size=3), max_leaves=10)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([400, 404, 429, 500, 503]), st.dictionaries(st.text(max_size=10), _json_scalar, max_size=4),
       _json)
def test_what_a_server_says_in_errors_and_extras_both_readers_read_back(clojure: Clojure, status: int,
                                                                        err: dict[str, Any], anything: Any) -> None:
    """Error objects with any keys and words, and any JSON kept as EDN (logprobs, engine extras)."""
    import json

    from kotoba_vllm._codec import json_to_edn

    e = classify_error(status, json.dumps({"error": err}).encode(), {}, "http://h")
    _both_read_back(clojure, e.to_edn())
    _both_read_back(clojure, json_to_edn(anything))
