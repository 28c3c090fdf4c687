"""`run`'s fast paths for reading a request file, held to the general paths byte for byte.

A plain line lexed by the tokenizer's fast path (`_edn_tokens.plain_tokens`) must read exactly what
the regular expression's tokens read - the same value, the same end offset, the same located keys; structuring a repeated `:vllm/sampling` map once must give the
same request and problems as structuring it every time; the records `run` writes for any input
(sent or refused, with file/line/column) are the same text either way.
"""

from __future__ import annotations

import io
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from kotoba_vllm import _codec, _edn, _edn_tokens
from kotoba_vllm._edn import EdnError, Form, dumps, read_coll_at
from kotoba_vllm._requests import request_to_edn
from kotoba_vllm.batch import Recorder
from kotoba_vllm.batch._entries import iter_edn_entries

_KEYWORDS = [":vllm/endpoint", ":vllm/model", ":vllm/sampling", ":vllm/messages", ":vllm/role", ":vllm/content",
             ":vllm/max-tokens", ":vllm/temperature", ":vllm/stop", ":vllm/seed", ":vllm/logprobs", ":chat",
             ":user", ":completion", ":a", ":x.y/z-1", ":vllm/nope", ":sglang/extra", ":a:", "::a", ":a#b", ":"]
_ODD = ["foo", "nilx", "-0", "007", "1e5", "1.", "+3", "7N", "1.5M", "-", "##NaN", "\\a", "\\newline",
        '#inst "2020-01-01T00:00:00Z"', '#uuid "00000000-0000-0000-0000-000000000000"', "#_ :x", "#{1 2}",
        "#{1 1}", "(1 2)", "#:vllm{:model \"m\"}", "^:m [1]", "#foo 1", '"a\\"b"', '"tab\\t"', '"\\u00e9"',
        '"unclosed', "}", "]", ")", "{", "[", "; c\n", "#", "4#x"]
atoms = st.one_of(
    st.sampled_from(_KEYWORDS),
    st.text(max_size=8).map(dumps),  # strings, escaped where needed
    st.text(st.characters(blacklist_characters='"\\\n'), max_size=6).map(lambda s: '"' + s + '"'),
    st.integers(-10**20, 10**20).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["nil", "true", "false", "0", "-0.0", "0.5"]),
    st.sampled_from(_ODD),
)
seps = st.sampled_from([" ", " ", ",", "  ", "\t", ", ", "\n", "\r\n", "\u2028", "\u00a0"])


def _join(parts: list[str], sep: list[str]) -> str:
    return "".join(p + s for p, s in zip(parts, sep + [""] * len(parts)))


def _coll(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    items = st.lists(children, max_size=6)
    return st.one_of(
        st.tuples(items, st.lists(seps, max_size=6)).map(lambda t: "[" + _join(t[0], t[1]) + "]"),
        st.tuples(items, st.lists(seps, max_size=6)).map(lambda t: "{" + _join(t[0], t[1]) + "}"),
        st.tuples(st.lists(st.tuples(st.sampled_from(_KEYWORDS[:12]), children), max_size=5),
                  st.lists(seps, max_size=5))
        .map(lambda t: "{" + _join([k + " " + v for k, v in t[0]], t[1]) + "}"),
    )


values = st.recursive(atoms, _coll, max_leaves=20)
maps = st.tuples(st.lists(st.tuples(st.sampled_from(_KEYWORDS[:12]) | atoms, values), max_size=6),
                 st.lists(seps, max_size=6)).map(lambda t: "{" + _join([k + " " + v for k, v in t[0]], t[1]) + "}")
tails = st.sampled_from(["", "\n", "  \n{:a 1}\n", " ; c\n", " 5\n", " {:b 2}", "\n\n", " \r\n", "\u2028\n"])


def _general(text: str, pos: int) -> tuple[Form, int]:
    """What read_coll_at gives with the tokenizer's fast path switched off."""
    with mock.patch.object(_edn_tokens, "plain_tokens", lambda *_: None):
        return read_coll_at(text, pos, "f.edn", 3, 5)


def _outcome(read: Any, text: str, pos: int) -> Any:
    try:
        form, end = read(text, pos)
    except EdnError as e:
        return ("error", e.msg, e.line, e.column)
    return ("form", _shape(form.value), end, _located(form, form.value))


def _shape(v: Any) -> Any:
    """The value with its exact types (1, 1.0 and true are equal in Python, not in EDN)."""
    if isinstance(v, dict):
        return ("map", [(_shape(k), _shape(x)) for k, x in v.items()])
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [_shape(x) for x in v])
    return (type(v).__name__, dumps(v))


def _located(form: Form, v: Any) -> list[Any]:
    """Where every key of every map inside `v` is, as `Form.locate` says."""
    out: list[Any] = []
    if isinstance(v, dict):
        for k, x in v.items():
            out.append((dumps(k), form.locate(v, k)))
            out.extend(_located(form, x))
        out.append(form.locate(v, "not a key"))
    elif isinstance(v, (list, tuple)):
        for x in v:
            out.extend(_located(form, x))
    return out


@settings(max_examples=600, deadline=None)
@given(st.text(" \n,", max_size=3), maps, tails)
def test_a_plain_line_reads_what_the_regular_expressions_tokens_read(lead: str, text: str, tail: str) -> None:
    whole = lead + text + tail
    general = _outcome(_general, whole, len(lead))
    # twice: the first read checks the keywords (and remembers them); the second must read the same
    assert _outcome(lambda t, p: read_coll_at(t, p, "f.edn", 3, 5), whole, len(lead)) == general
    assert _outcome(lambda t, p: read_coll_at(t, p, "f.edn", 3, 5), whole, len(lead)) == general


def test_a_request_line_takes_the_plain_path_and_locates_its_keys() -> None:
    line = ('{:vllm/endpoint :chat :vllm/model "m" :vllm/sampling {:vllm/max-tokens 4 :vllm/temperature 0.5} '
            ':vllm/messages [{:vllm/role :user :vllm/content "hi é"}]}\n')
    _general(line, 0)
    form, end = read_coll_at(line, 0, "f.edn", 7, 1)
    assert _edn_tokens.plain_tokens(line) is not None  # the plain path is taken
    assert end == len(line) - 1
    messages = form.value[_edn.kw("vllm/messages")]
    assert isinstance(messages, list)
    assert form.locate(messages[0], _edn.kw("vllm/content")) == (7, line.index(":vllm/content") + 1)
    assert form.locate(form.value[_edn.kw("vllm/sampling")], _edn.kw("vllm/temperature")) == (7, line.index(":vllm/temp") + 1)


def _records(text: str) -> list[str]:
    rec = Recorder("edn")
    out = []
    for e in iter_edn_entries(io.StringIO(text), "f.edn"):
        if e.sendable:
            assert e.request is not None
            out.append(dumps(request_to_edn(e.request)))
        else:
            out.extend(rec.invalid(e))
    return out


requests = st.tuples(
    st.sampled_from([":chat", ":completion", ":nope", "1"]),
    st.sampled_from(['"m"', "1", "nil", '"a\\nb"']),
    st.lists(st.tuples(st.sampled_from([":vllm/max-tokens", ":vllm/temperature", ":vllm/seed", ":vllm/n",
                                        ":vllm/stop", ":vllm/logprobs", ":vllm/top-k", ":x", "1", '"s"']),
                       st.sampled_from(["4", "0", "-1", "0.5", "-0.0", "1.0", "true", "false", "nil", '"x"',
                                        "[\"a\" \"b\"]", "##NaN", "1.5M", "7N", "{}", ":k"])), max_size=4),
    st.sampled_from(['[{:vllm/role :user :vllm/content "hi"}]', "[]", '[{:vllm/role :tool :vllm/content "x"}]',
                     '[{:vllm/role :user}]', '"hi"', '[{:vllm/role :user :vllm/content "é" :vllm/x 1}]']),
).map(lambda t: "{:vllm/endpoint " + t[0] + " :vllm/model " + t[1] + " :vllm/sampling {"
      + " ".join(k + " " + v for k, v in t[2]) + "} :vllm/messages " + t[3] + " :vllm/prompt \"p\"}")


@settings(max_examples=300, deadline=None)
@given(st.lists(requests.map(lambda r: (True, r)) | maps.map(lambda m: (False, m)), min_size=1, max_size=6),
       st.sampled_from(["\n", "\r\n", " ", "\n;c\n"]))
def test_records_are_the_same_text_with_the_fast_paths_off(drawn: list[tuple[bool, str]], sep: str) -> None:
    text = sep.join(line for _, line in drawn) + "\n"
    fast = _records(text)
    fast_again = _records(text)  # keywords checked and samplings shared by now
    with mock.patch.object(_edn_tokens, "plain_tokens", lambda *_: None), mock.patch.object(_codec, "_SHARED_MAPS", {}):
        general = _records(text)
    assert fast == general
    assert fast_again == general
    if all(well_formed for well_formed, _ in drawn):  # N requests in, N records out
        assert len(general) == len(drawn)


def test_reading_does_not_depend_on_what_was_read_before() -> None:
    """A keyword no reader has met yet reads on the first line as on every line after."""
    from kotoba_vllm._edn import _KW_READ
    text = '{:first-time/never-seen-before-9f3 1 :vllm/model "m"}'
    _KW_READ.clear()  # a fresh process: nothing read yet
    first = _outcome(lambda t, p: read_coll_at(t, p, "f.edn", 1, 1), text, 0)
    again = _outcome(lambda t, p: read_coll_at(t, p, "f.edn", 1, 1), text, 0)
    assert first == again and first[0] == "form"
    _KW_READ.clear()
    assert _outcome(lambda t, p: read_coll_at(t, p, "f.edn", 1, 1), '{:a/ 1}', 0) == ("error", "invalid keyword ':a/'", 1, 2)
