"""Text inputs cut into byte spans on the driver: every span, read on its own, gives exactly the
requests, indices and positions the whole-file reader gives, however the forms are written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kotoba_vllm._edn import EdnError, read_forms, read_one
from kotoba_vllm.ray._spans import Span, plan_edn, plan_jsonl, read_edn_span, read_jsonl_span

# Pieces a request file can hold that a naive bracket count gets wrong.
TRICKY_STRINGS = st.sampled_from(['"x}"', '"{["', '"a\\"b}"', '"line\n{break"', '"é{"', '"\\\\"', '";not a comment"'])
CHARS = st.sampled_from(["\\{", "\\}", "\\[", "\\]", "\\(", "\\)", '\\"', "\\;", "\\newline", "\\a", "\\é"])
ATOMS = st.one_of(st.integers(-5, 99).map(str), st.sampled_from([":k", ":vllm/x", "nil", "true", "sym"]),
                  TRICKY_STRINGS, CHARS)
GAPS = st.sampled_from([" ", "\n", ",", "\r\n", "\t", " ; a comment with { and \" \n", "\n\n", ";}\n"])


def _form(depth: int = 2) -> st.SearchStrategy[str]:
    # Maps are built from pairs with distinct keys and sets from distinct atoms, so almost every form reads: a
    # strategy that made odd maps or duplicate keys was filtered so often that hypothesis gave up on the test.
    inner = ATOMS if depth == 0 else st.one_of(ATOMS, st.deferred(lambda: _form(depth - 1)))
    items = st.lists(st.tuples(inner, GAPS), max_size=4).map(lambda xs: "".join(a + g for a, g in xs))
    members = st.lists(st.tuples(ATOMS, GAPS), max_size=4, unique_by=lambda t: t[0]).map(
        lambda xs: "".join(a + g for a, g in xs))
    pairs = st.lists(st.tuples(ATOMS, GAPS, inner, GAPS), max_size=3, unique_by=lambda t: t[0]).map(
        lambda xs: "".join(k + g + v + h for k, g, v, h in xs))
    return st.one_of(
        st.tuples(st.sampled_from(["[", "("]), items).map(lambda t: t[0] + t[1] + {"[": "]", "(": ")"}[t[0]]),
        pairs.map(lambda s: "{" + s + "}"),
        members.map(lambda s: "#{" + s + "}"),
        pairs.map(lambda s: "{:vllm/content " + '"q"' + " " + s + "}"),
    )


TOP = st.one_of(_form(), _form(), _form(), ATOMS, st.sampled_from(["#_ {:gone 1}", "#inst \"2024-01-01T00:00:00Z\"",
                                                                   "^{:m 1} {:a 1}", "#_ 42"]))


def _rows(path: str, spans: list[Span], reader: object) -> list[tuple[int, str, str]]:
    out = []
    for s in spans:
        got = list(reader(path, s))  # type: ignore[operator]
        assert len(got) == s.rows, s
        out += [(s.first + i, text, where) for i, (text, where) in enumerate(got)]
    return out


def _check_spans(spans: list[Span], size: int, block_rows: int) -> None:
    assert [s.first for s in spans] == [sum(x.rows for x in spans[:i]) for i in range(len(spans))]
    assert all(0 <= a.end <= b.start for a, b in zip(spans, spans[1:]))  # disjoint, in file order
    assert all(s.end <= size for s in spans)
    assert all(s.rows >= block_rows for s in spans[:-1])  # only the last is short


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(TOP, GAPS), min_size=0, max_size=12), st.sampled_from(["", "\n", " ;; head {\n"]),
       st.integers(1, 5))
def test_edn_spans_read_the_forms_the_whole_file_reader_reads(
        tmp_path_factory: pytest.TempPathFactory, items: list[tuple[str, str]], head: str, block_rows: int) -> None:
    text = head + "".join(f + g for f, g in items)
    try:
        whole = [(f.value, f"{{p}}:{f.line}:{f.column}") for f in read_forms(text, "{p}")]
    except EdnError:
        assume(False)  # a generated combination the reader rejects as a whole (e.g. a tag on a bad value)
    path = str(tmp_path_factory.mktemp("spans") / "in.edn")
    Path(path).write_bytes(text.encode("utf-8"))
    if re.match(r"(?:[\s,]+|;[^\n\r]*)*\[", text):
        assume(False)  # a file that opens with a vector is the one-vector shape: its own test below
    spans = list(plan_edn(path, block_rows))
    _check_spans(spans, len(text.encode("utf-8")), block_rows)
    rows = _rows(path, spans, read_edn_span)
    assert [i for i, _, _ in rows] == list(range(len(rows)))
    want = [(v, w.replace("{p}", path)) for v, w in whole]
    assert [(read_one(t), w) for _, t, w in rows] == want


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_form(), GAPS), min_size=1, max_size=10), st.integers(1, 4))
def test_one_vector_of_requests_is_cut_between_its_elements(
        tmp_path_factory: pytest.TempPathFactory, items: list[tuple[str, str]], block_rows: int) -> None:
    body = "".join(f + g for f, g in items)
    text = ";; requests\n[" + body + "]\n"
    try:
        elements = list(read_forms(body, "p", line=2, column=2))
    except EdnError:
        assume(False)
    path = str(tmp_path_factory.mktemp("spans") / "in.edn")
    Path(path).write_bytes(text.encode("utf-8"))
    spans = list(plan_edn(path, block_rows))
    _check_spans(spans, len(text.encode("utf-8")), block_rows)
    rows = _rows(path, spans, read_edn_span)
    assert [(read_one(t), w) for _, t, w in rows] == [(f.value, f"{path}:{f.line}:{f.column}") for f in elements]


def test_a_broken_file_shape_is_a_located_error_on_the_driver(tmp_path: Path) -> None:
    never = tmp_path / "a.edn"
    never.write_text("[{:a 1}\n {:b 2}\n")
    with pytest.raises(EdnError, match=r"a\.edn:1:1: .*never closed"):
        list(plan_edn(str(never), 1))
    after = tmp_path / "b.edn"
    after.write_text("[{:a 1}]\n{:b 2}\n")
    with pytest.raises(EdnError, match=r"b\.edn:2:1: .*nothing after it"):
        list(plan_edn(str(after), 1))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
                                  max_size=12),
                          st.sampled_from(["", "  ", "\t"])), max_size=15),
       st.sampled_from(["\n", "\r\n"]), st.booleans(), st.integers(1, 4))
def test_jsonl_spans_hold_every_non_blank_line_with_its_number(
        tmp_path_factory: pytest.TempPathFactory, lines: list[str], eol: str, final_eol: bool,
        block_rows: int) -> None:
    text = eol.join(lines) + (eol if final_eol else "")
    path = str(tmp_path_factory.mktemp("spans") / "in.jsonl")
    Path(path).write_bytes(text.encode("utf-8"))
    spans = list(plan_jsonl(path, block_rows))
    _check_spans(spans, len(text.encode("utf-8")), block_rows)
    rows = _rows(path, spans, read_jsonl_span)
    physical = text.encode("utf-8").splitlines()  # what a line is: \n or \r\n, as the planner reads bytes
    want = [(raw.decode("utf-8"), f"{path}:{n}:1") for n, raw in enumerate(physical, 1) if raw.strip()]
    assert [(t, w) for _, t, w in rows] == want


def test_resume_gives_each_read_task_only_its_share_and_no_task_to_a_finished_span(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    pytest.importorskip("ray.data")
    from kotoba_vllm.ray import request_datasource

    path = tmp_path / "in.jsonl"
    path.write_text("".join(f'{{"custom_id": "r{i}"}}\n' for i in range(10)))
    done = np.array([0, 1, 2, 3, 5, 9], dtype=np.int64)  # what part files already hold
    tasks = request_datasource(str(path), block_rows=4, skip=done).get_read_tasks(1)
    assert len(tasks) == 2  # indices 0-3 are all done: no task reads them
    tables = [t for task in tasks for t in task()]
    assert [i for t in tables for i in t.column("request_index").to_pylist()] == [4, 6, 7, 8]
    assert [w for t in tables for w in t.column("where").to_pylist()] == [f"{path}:{n}:1" for n in (5, 7, 8, 9)]
