"""The streaming EDN reader: same forms and positions as the whole-text reader, any chunk size."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kotoba_vllm._edn import EdnError, dumps, kw, read_forms
from kotoba_vllm.batch import iter_entries
from kotoba_vllm.batch._edn_stream import FormStream

TRICKY = [
    '{:a 1}\n{:b "x]"} ; a comment with ] and "\n {:c [1 2 (3)]}',
    ';; head\n#_ {:x 1} {:y #{1 2}} :kw {:z \\] :w \\( }',
    '{:s "multi\nline [ string"}\n\n{:t #inst "2024-01-01T00:00:00Z"}',
    '{:a "\\"quoted\\" ]"} {:b 2}',
]


def forms(text: str, chunk: int) -> list[tuple[object, int, int]]:
    return [(f.value, f.line, f.column) for f in FormStream(io.StringIO(text), "s", chunk=chunk,
                                                             vector_elements=False)]


@pytest.mark.parametrize("text", TRICKY)
@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8, 64, 1 << 20])
def test_stream_matches_whole_reader_at_every_chunk_size(text: str, chunk: int) -> None:
    whole = [(f.value, f.line, f.column) for f in read_forms(text, "s")]
    assert forms(text, chunk) == whole


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["a", "b", "c/d"]),
                                st.one_of(st.integers(), st.text(max_size=8), st.lists(st.text(max_size=3),
                                                                                        max_size=3)),
                                max_size=3), max_size=6),
       st.integers(1, 17))
def test_stream_round_trips_generated_maps(maps: list[dict[str, object]], chunk: int) -> None:
    values = [{kw(k): v for k, v in m.items()} for m in maps]
    text = "\n".join(dumps(v) for v in values)
    assert [v for v, _, _ in forms(text, chunk)] == values


def test_one_vector_is_streamed_element_by_element_with_positions() -> None:
    text = '[{:a 1}\n {:b 2}]\n'
    got = [(f.value, f.line, f.column) for f in FormStream(io.StringIO(text), "s", chunk=3)]
    assert got == [({kw("a"): 1}, 1, 2), ({kw("b"): 2}, 2, 2)]


def test_forms_after_the_one_vector_are_a_located_error() -> None:
    with pytest.raises(EdnError, match="s:2:1: .*nothing after it"):
        list(FormStream(io.StringIO("[{:a 1}]\n{:b 2}"), "s"))


def test_recover_reports_a_bad_form_and_reads_on() -> None:
    text = '{:a 1}\n{:b #= (x)}\n{:c 3}'
    got = list(FormStream(io.StringIO(text), "s", recover=True))
    assert got[0].value == {kw("a"): 1}
    assert isinstance(got[1], EdnError) and (got[1].line, got[1].column) == (2, 5)
    assert got[2].value == {kw("c"): 3}


def test_entries_are_located_and_a_syntax_error_is_an_entry_not_the_end(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "b.edn"
    p.write_text('{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "hi"}]}\n'
                 '{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user #= 1}]}\n'
                 '{:vllm/endpoint :chat :vllm/messages [] :vllm/bogus 1}\n'
                 '{:vllm/endpoint :chat :vllm/request-id "last" :vllm/messages [{:vllm/role :user :vllm/content "x"}]}\n',
                 encoding="utf-8")
    es = list(iter_entries(str(p)))
    assert [e.index for e in es] == [0, 1, 2, 3]
    assert [e.sendable for e in es] == [True, False, False, True]
    assert es[1].problems[0].code == "edn/syntax" and es[1].where == f"{p}:2:{p.read_text().splitlines()[1].index('#=') + 1}"
    assert any(pr.field == "vllm/bogus" for pr in es[2].problems)
    assert es[3].request_id == "last" and es[3].where == f"{p}:4:1"
