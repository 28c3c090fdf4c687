"""The tokenizer's fast path's token edges: every character that ends a token for Python's `str.split` but not for
clojure.edn (or the other way round) reads exactly as the general reader reads it."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from kotoba_vllm import _edn, _edn_tokens
from kotoba_vllm._edn import EdnError, dumps, read_coll_at

# U+0085, U+00A0, U+2007 and U+202F split for Python and are token characters for Clojure; U+2028 and U+3000
# split for both; the comma is blank for EDN alone; the rest end (or do not end) a token for EDN alone.
SEPARATORS = [" ", ",", ", ", "\t", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "\u2007", "\u202f", "\u2028",
              "\u3000", "", ";", "^", "#", "(", ")", "'", "@", "~", "\\"]


def _read(text: str) -> Any:
    try:
        form, end = read_coll_at(text, 0, "f.edn", 1, 1)
    except EdnError as e:
        return ("error", e.msg, e.line, e.column)
    return ("form", dumps(form.value), end, [type(x).__name__ for x in form.value.values()])


@pytest.mark.parametrize("sep", SEPARATORS)
@pytest.mark.parametrize("template", ["{:a{sep}1}", "{:a 1{sep}:b 2}", '{:a "x"{sep}:b 2}', "{:a [1{sep}2]}",
                                      "{:a nil{sep}}", '{:a "x{sep}y"}', "{:a{sep}:b}", "{:a 1}{sep}",
                                      "{:a -1.5{sep}}"])
def test_each_separator_reads_as_the_general_reader_reads_it(template: str, sep: str) -> None:
    text = template.replace("{sep}", sep) + "\n"
    with mock.patch.object(_edn_tokens, "plain_tokens", lambda *_: None):
        general = _read(text)
    assert _read(text) == general
    assert _read(text) == general  # keywords checked by now: the plain path is tried with them known


def test_a_plain_line_with_commas_and_unicode_strings_takes_the_plain_path() -> None:
    line = '{:vllm/model "m, é [x] {y}", :vllm/messages [{:vllm/role :user, :vllm/content "日本語"}]}\n'
    with mock.patch.object(_edn_tokens, "plain_tokens", lambda *_: None):
        general = _read(line)
    assert _edn_tokens.plain_tokens(line) is not None
    assert _read(line) == general
