"""The EDN boundary: located errors, multiple forms, stdin, and writers that round-trip."""

from __future__ import annotations

import io
import math
from decimal import Decimal
from pathlib import Path

import pytest
from _strategies import edn_values
from hypothesis import given, settings

from kotoba_vllm._edn import (BigInt, Char, EdnError, Keyword, Symbol, dumps, keyword_or_string, kw, pretty, read_all,
                              read_file, read_forms, read_one)
from kotoba_vllm._requests import request_from_edn


def _err(text: str, source: str = "req.edn") -> EdnError:
    with pytest.raises(EdnError) as ei:
        read_all(text, source)
    return ei.value


@pytest.mark.parametrize("text, line, column, needle", [
    ("{:vllm/model \"m\"\n :vllm/model \"n\"}", 2, 2, "duplicate map key :vllm/model"),
    ("[1\n #{:a :b\n :a}]", 3, 2, "duplicate set element :a"),
    ("{:a 1}\n  #my/tag {:b 2}", 2, 3, "unknown tag #my/tag"),
    ("\n\n   #=(java.lang.System/exit 0)", 3, 4, "evaluation (#=) is not allowed"),
    ("{:a [1 2}", 1, 9, "expected ']'"),
    ("{:a 1", 1, 1, "never closed"),
    ("{:a 1 :b}", 1, 1, "odd number"),
    ("{:vllm/prompt \"unterminated}", 1, 15, "string is never closed"),
    ("[:ok]\n:bad/", 2, 1, "invalid keyword"),
    ("1.2.3", 1, 1, "invalid number"),
    ("\"bad \\q escape\"", 1, 6, "invalid string escape"),
])
def test_errors_name_file_line_and_column(text: str, line: int, column: int, needle: str) -> None:
    e = _err(text)
    assert (e.source, e.line, e.column) == ("req.edn", line, column)
    assert needle in e.msg
    assert str(e).startswith(f"req.edn:{line}:{column}: ")
    # the error is EDN data too
    assert e.to_edn()[kw("vllm/line")] == line and e.to_edn()[kw("vllm/error")] == kw("edn-syntax")


def test_a_non_keyword_key_in_a_request_is_a_located_problem() -> None:
    forms = list(__import__("kotoba_vllm._edn", fromlist=["read_forms"]).read_forms(
        '{:vllm/endpoint :chat\n :vllm/messages [{:vllm/role :user :vllm/content "hi"}]\n "temperature" 0.5}',
        "chat.edn"))
    req, problems = request_from_edn(forms[0].value, forms[0])
    assert req is None
    [p] = problems
    assert p.code == "edn/non-keyword-key" and p.where == "chat.edn:3:2"
    assert '"temperature"' in p.msg


def test_many_forms_and_their_positions(tmp_path: Path) -> None:
    f = tmp_path / "two.edn"
    f.write_text(";; two requests\n{:a 1}\n\n  {:b 2} ; trailing\n#_{:skipped 3}\n", encoding="utf-8")
    forms = read_file(str(f))
    assert [x.value for x in forms] == [{kw("a"): 1}, {kw("b"): 2}]
    assert [x.where for x in forms] == [f"{f}:2:1", f"{f}:4:3"]


def test_stdin_is_read_with_dash() -> None:
    forms = read_file("-", stdin=io.StringIO("{:a 1} [2 3]"))
    assert [x.value for x in forms] == [{kw("a"): 1}, [2, 3]]
    assert forms[1].source == "<stdin>"


def test_not_utf8_file_is_a_located_error(tmp_path: Path) -> None:
    f = tmp_path / "latin1.edn"
    f.write_bytes(b'{:a "\xff"}')
    with pytest.raises(EdnError, match=r"latin1.edn:1:1: not UTF-8"):
        read_file(str(f))


def test_scalars_read_as_the_documented_python_types() -> None:
    v = read_one('[nil true false 42 -7 1.5 1e3 "s\\n\\u00e9" :k :ns/k sym \\a (1 2) #{1} {:m 1} 2N]')
    assert v == [None, True, False, 42, -7, 1.5, 1000.0, "s\né", kw("k"), kw("ns/k"), Symbol("sym"), Char("a"),
                 (1, 2), frozenset({1}), {kw("m"): 1}, 2]
    assert isinstance(v[8], Keyword) and kw("ns/k") is v[9]  # keywords are interned


def test_inst_and_uuid_tags_are_known() -> None:
    d, u = read_all('#inst "2026-01-02T03:04:05Z" #uuid "6ba7b810-9dad-11d1-80b4-00c04fd430c8"')
    assert d.year == 2026 and str(u) == "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
    assert read_all(dumps(d) + " " + dumps(u)) == [d, u]


def test_writer_escapes_what_must_be_escaped() -> None:
    s = 'quote " backslash \\ nl \n tab \t nul \x00 bell \x07'
    text = dumps(s)
    assert "\n" not in text and read_one(text) == s


def test_pretty_breaks_long_maps_one_entry_a_line() -> None:
    m = {kw("vllm/messages"): [{kw("vllm/role"): kw("user"), kw("vllm/content"): "x" * 60}] * 2,
         kw("vllm/model"): "m"}
    text = pretty(m, width=60)
    assert text.count("\n") >= 2 and read_one(text) == m
    assert pretty({kw("a"): 1}) == "{:a 1}"


def _same(a: object, b: object) -> bool:
    """Structural equality that also tells -0.0 from 0.0 and a list from a tuple."""
    if type(a) is not type(b) and not (isinstance(a, Keyword) and isinstance(b, Keyword)):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)  # type: ignore[arg-type]
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))  # type: ignore[arg-type]
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)  # type: ignore[union-attr,index]
    return a == b


@settings(max_examples=150, deadline=None)
@given(edn_values)
def test_compact_writer_round_trips(v: object) -> None:
    assert _same(read_one(dumps(v)), v)


@settings(max_examples=100, deadline=None)
@given(edn_values)
def test_pretty_writer_round_trips(v: object) -> None:
    text = pretty(v, width=30)
    assert _same(read_one(text), v)


@settings(max_examples=50, deadline=None)
@given(edn_values, edn_values)
def test_many_forms_round_trip(a: object, b: object) -> None:
    got = read_all(dumps(a) + "\n" + pretty(b))
    assert len(got) == 2 and _same(got[0], a) and _same(got[1], b)


# ------------------------------------------------------------------ what Clojure writes (issue 16)
# The same forms are checked against the real Clojure reader in test_clojure_interop.py.


def test_clojure_printed_request_with_namespaced_map_and_metadata_is_a_request() -> None:
    text = ('^{:doc "from a REPL"}\n#:vllm{:endpoint :chat, :model "m",\n'
            ' :messages [#:vllm{:role :user, :content "smile \\uD83D\\uDE00 \\101"}]}')
    [form] = read_forms(text, "repl.edn")
    req, problems = request_from_edn(form.value, form)
    assert problems == [] and req is not None
    assert req.messages[0].content == "smile \U0001F600 A"  # type: ignore[union-attr]
    assert form.locate(form.value, kw("vllm/model")) == (2, 25)  # keys inside #:vllm{} keep their place


@pytest.mark.parametrize(("text", "char"), [("\\o101", "A"), ("\\formfeed", "\f"), ("\\backspace", "\b"),
                                            ("\\u00e9", "é"), ("\\newline", "\n"), ("\\(", "(")])
def test_char_forms_read_as_clojure_reads_them(text: str, char: str) -> None:
    v = read_one(text)
    assert isinstance(v, Char) and v == Char(char) and v != char  # a char is never its one-char string
    assert read_one(dumps(v)) == v


@pytest.mark.parametrize("text", ["\\abc", "\\u00e9x", "\\uD83D", "\\o400", ":a:", "a/1", "#::{:a 1}",
                                  "^:m 1", '"\\1x"', "#inst \"2026-11-30 12:00\""])
def test_forms_clojure_refuses_are_refused_with_a_position(text: str) -> None:
    with pytest.raises(EdnError) as ei:
        read_all("\n  " + text, "x.edn")
    assert (ei.value.source, ei.value.line) == ("x.edn", 2)


def test_big_numbers_keep_their_kind() -> None:
    n, d = read_all("7N 1.50M")
    assert isinstance(n, BigInt) and n == 7 and dumps(n) == "7N"
    assert d == Decimal("1.50") and dumps(d) == "1.50M"


def test_writer_never_writes_what_it_cannot_read_back() -> None:
    assert read_one(dumps(Char("\x0c"))) == Char("\x0c") and dumps(Char("\x0c")) == "\\formfeed"
    assert read_one(dumps(Char("\x01"))) == Char("\x01")
    for bad in (Keyword("stop sequence"), Keyword("1st_stop"), Symbol("a b"), Char("\U0001F600"),
                Decimal("NaN")):
        with pytest.raises(ValueError):
            dumps(bad)
    assert dumps(keyword_or_string("stop sequence")) == '"stop sequence"'
    assert dumps(keyword_or_string("content_filter")) == ":content_filter"


def test_streamed_forms_with_metadata_and_namespaced_maps_keep_their_positions() -> None:
    from kotoba_vllm.batch import FormStream

    text = ('^{:doc "a"} {:vllm/x 1}\n#:vllm{:y [2]}\n^:m [3]\r; cr-ended comment\r:after\n'
            '#_ ^{:z 1} {:gone 0} {:last "\\uD83D\\uDE00"}')
    for chunk in (3, 7, 1 << 20):
        got = [(f.value, f.line, f.column) for f in FormStream(io.StringIO(text), "s.edn", chunk=chunk)]
        assert got == [({kw("vllm/x"): 1}, 1, 1), ({kw("vllm/y"): [2]}, 2, 1), ([3], 3, 1),
                       (kw("after"), 3, 28), ({kw("last"): "\U0001F600"}, 4, 22)], chunk
