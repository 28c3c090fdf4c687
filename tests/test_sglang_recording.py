"""The SGLang recording rig (scripts/record-sglang) keeps its promise: only the scheduler is simulated,
and the simulation writes no answer of its own. Runs without SGLang installed (reads the source)."""

from __future__ import annotations

import ast
from pathlib import Path

from kotoba_vllm._edn import kw
from kotoba_vllm.cassettes import load_cassettes

FAKE = Path(__file__).resolve().parent / "recording" / "sglang_fake_scheduler.py"
# Words of an HTTP answer, an error or an admission decision: SGLang's code must write them, not the fake.
ANSWER_WORDS = ("error", "queue", "full", "abort", "reject", "unavailable", "busy", "503", "429", "400", "message",
                "detail", '"object"', "{", "invalid", "exceed", "context length")


def _strings(tree: ast.AST) -> set[str]:
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(n)}
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings}


def test_fake_scheduler_writes_no_answer_or_error_text() -> None:
    strings = _strings(ast.parse(FAKE.read_text(encoding="utf-8")))
    bad = sorted(s for s in strings if any(w in s.lower() for w in ANSWER_WORDS))
    assert not bad, f"the fake scheduler carries answer/error text: {bad}"


def test_fake_scheduler_admits_through_sglangs_own_queue_limit() -> None:
    src = FAKE.read_text(encoding="utf-8")
    assert "._abort_on_queued_limit(self.admission, req)" in src  # SGLang's Scheduler method, unchanged
    assert "def _abort_on_queued_limit" not in src and "def send_abort_output" not in src  # not re-implemented


def test_recorded_queue_full_answers_come_from_sglang() -> None:
    """Every queue-full cassette is recorded (none derived) and carries SGLang's own message."""
    cassettes = [c for c in load_cassettes("sglang") if "queue-full" in c.name]
    assert len(cassettes) >= 7
    for c in cassettes:
        assert c.how == "recorded", c.id
        err = c.expect[kw("expect/error")]
        assert err[kw("vllm/reason")] == kw("queue-full") and err[kw("vllm/status")] == 503, c.id
        assert b"The request queue is full." in c.raw
