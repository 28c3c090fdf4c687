"""The tokenizer's fast path (a plain line split in C) gives the regular expression's tokens, offsets and ends."""

from __future__ import annotations

from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from kotoba_vllm import _edn_tokens
from kotoba_vllm._edn_tokens import Tokens, blank_end

_PIECES = [":vllm/model", ":a", "1", "-2.5", "nil", "true", '"s"', '"a b, {c}"', '"é"', '""', "{", "}", "[", "]",
           "(", ")", "#{", "#_", "#inst", "^:m", ";c", "\\a", "\\", '"', "x'y", "a#b", "日本", "#", "##NaN", "é"]
_SEPS = [" ", "", ",", "\n", "\r\n", "\t", "\u2028", "\xa0", "  ,"]


def _lexed(text: str, start: int) -> list[tuple[str, int, int]]:
    lex = Tokens(text, start)
    return [(tok, lex.offset(i), lex.end(i)) for i, tok in lex]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_PIECES), st.sampled_from(_SEPS)), max_size=30), st.integers(0, 3))
def test_the_fast_path_lexes_as_the_regular_expression_does(parts: list[tuple[str, str]], start: int) -> None:
    text = "".join(p + s for p, s in parts)
    start = min(start, len(text))
    fast = _lexed(text, start)
    with mock.patch.object(_edn_tokens, "plain_tokens", lambda *_: None):
        general = _lexed(text, start)
    assert fast == general
    for tok, at, end in general:
        assert text[at:end] == tok


def test_a_request_line_takes_the_fast_path() -> None:
    line = '{:vllm/model "m, é [x]" :vllm/messages [{:vllm/role :user :vllm/content "hi"}]}\n'
    assert _edn_tokens.plain_tokens(line) is not None
    assert _edn_tokens.plain_tokens('{:a "x\\"y"}\n') is None  # an escape: the regular expression


def test_a_long_line_is_lexed_as_far_as_it_is_read() -> None:
    text = "[" + " ".join(['{:a "x"}'] * 20000) + "]"
    lex = Tokens(text)
    assert [tok for _, (_i, tok) in zip(range(4), lex)] == ["[", "{", ":a", '"x"']
    assert lex.offset(3) == 5 and lex.end(3) == 8


def test_blank_end_skips_blanks_and_comments_and_keeps_a_comment_cut_by_the_end() -> None:
    assert blank_end("  ; c\n , x", 0) == 9
    assert blank_end("  ; c", 0) == 2
    assert blank_end("", 0) == 0
