"""The EDN boundary: located errors, multiple forms, stdin, and writers that round-trip."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
from _strategies import edn_values
from hypothesis import given, settings

from kotoba_vllm._edn import EdnError, Keyword, Symbol, dumps, kw, pretty, read_all, read_file, read_one
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
    assert v == [None, True, False, 42, -7, 1.5, 1000.0, "s\né", kw("k"), kw("ns/k"), Symbol("sym"), "a",
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
