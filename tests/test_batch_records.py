"""One record per input, whatever the sender does: raise anything, hang, get cancelled,
return garbage - and across an interrupt and `--resume`."""

from __future__ import annotations

import asyncio
import builtins
import io
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faultserver import FaultServer
from kotoba_vllm._edn import kw, read_all
from kotoba_vllm._errors import InternalError, Unreachable
from kotoba_vllm._model import ChatRequest, Choice, Message, Response
from kotoba_vllm.batch import BatchEntry, BatchRunner, OrderedSink, Recorder, journal_path, load_existing
from kotoba_vllm.cli import main

K_INDEX = kw("vllm/request-index")
K_ERROR = kw("vllm/error")
K_TYPE = kw("vllm/exception-type")
# A hung request is cut off after this; an answering one (a few ms) must never reach it, even on a loaded
# machine (0.05 s was reached at load 40).
DEADLINE_S = 0.15


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def _constructible(c: type[BaseException]) -> bool:
    try:
        c("boom")
    except Exception:
        return False
    return True


# Every builtin exception a sender could raise (KeyboardInterrupt and SystemExit end the process, by design).
EXCEPTIONS = sorted((c for c in vars(builtins).values()
                     if isinstance(c, type) and issubclass(c, BaseException)
                     and c not in (KeyboardInterrupt, SystemExit, GeneratorExit) and _constructible(c)),
                    key=lambda c: c.__name__) + [BrokenStr, asyncio.CancelledError]

behaviours = st.one_of(
    st.just(("ok",)),
    st.tuples(st.just("raise"), st.sampled_from(EXCEPTIONS)),
    st.just(("typed",)),  # a KotobaError, recorded as itself
    st.just(("hang",)),  # never returns: cancelled at the deadline
    st.just(("stubborn",)),  # ignores the first cancel, answers late
    st.just(("cancel-self",)),  # its own task gets cancelled
    st.just(("garbage",)),  # returns something that is not (response, deltas)
)


def _entry(i: int) -> BatchEntry:
    return BatchEntry(i, f"mem:{i}", ChatRequest(messages=(Message(role="user", content=f"q{i}"),)))


def _sender(plan: list[tuple[Any, ...]], calls: Counter[int]) -> Any:
    async def send(e: BatchEntry) -> tuple[Any, list[Any]]:
        calls[e.index] += 1
        what = plan[e.index]
        await asyncio.sleep(0.001 * (e.index % 3))
        if what[0] == "raise":
            raise what[1]("boom")
        if what[0] == "typed":
            raise Unreachable("connection refused", endpoint="http://fake")
        if what[0] == "hang":
            await asyncio.Event().wait()
        if what[0] == "stubborn":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await asyncio.sleep(0.01)
        if what[0] == "cancel-self":
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(1)
        if what[0] == "garbage":
            return 42  # type: ignore[return-value]
        return Response(text=f"a{e.index}", choices=(Choice(index=0, text=f"a{e.index}"),)), []

    return send


def _expected_kind(what: tuple[Any, ...]) -> str:
    return {"ok": "ok", "typed": "unreachable", "hang": "timeout", "stubborn": "timeout"}.get(what[0], "internal")


async def _run(plan: list[tuple[Any, ...]], output: str, calls: Counter[int], *, resume: bool,
               stop_after: int | None, abandon: bool, concurrency: int) -> Any:
    existing = load_existing(output, "edn") if resume else None
    with open(output, "a" if resume else "w", encoding="utf-8") as fh:
        sink = OrderedSink(fh, journal=journal_path(output), skip=existing.done if existing else ())
        runner = BatchRunner(_sender(plan, calls), sink, Recorder("edn"), concurrency=concurrency,
                             existing=existing, deadline_s=DEADLINE_S)
        task = asyncio.ensure_future(runner.run([_entry(i) for i in range(len(plan))]))
        if stop_after is not None:
            while runner.summary.recorded < stop_after and not task.done():
                await asyncio.sleep(0.001)
            runner.stop()
            if abandon:
                runner.stop()
        return await task


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(plan=st.lists(behaviours, min_size=1, max_size=9), concurrency=st.integers(1, 4),
       stop_after=st.one_of(st.none(), st.integers(0, 8)), abandon=st.booleans())
def test_n_inputs_give_n_records_in_order_whatever_the_sender_does(
        plan: list[tuple[Any, ...]], concurrency: int, stop_after: int | None, abandon: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        output = str(Path(tmp) / "out.edn")
        calls: Counter[int] = Counter()
        first = asyncio.run(_run(plan, output, calls, resume=False, stop_after=stop_after, abandon=abandon,
                                 concurrency=concurrency))
        if not first.complete:  # interrupted: --resume completes the file
            second = asyncio.run(_run(plan, output, calls, resume=True, stop_after=None, abandon=False,
                                      concurrency=concurrency))
            assert second.complete
        else:
            assert first.recorded == len(plan)
        records = read_all(Path(output).read_text(encoding="utf-8"))
        assert [r[K_INDEX] for r in records] == list(range(len(plan)))
        for r, what in zip(records, plan):
            kind = r[K_ERROR].name if K_ERROR in r else "ok"
            assert kind == _expected_kind(what), (what, r)
            if what[0] == "raise":  # a coroutine's StopIteration reaches asyncio as a RuntimeError (PEP 479)
                name = "RuntimeError" if what[1] is StopIteration else what[1].__qualname__
                assert r[K_TYPE].endswith(name) and name in r[kw("vllm/message")]
        assert not Path(journal_path(output)).exists()


def test_the_summary_counts_what_was_written() -> None:
    plan = [("ok",), ("raise", KeyError), ("hang",), ("raise", asyncio.CancelledError), ("garbage",), ("ok",)]
    out = io.StringIO()
    runner = BatchRunner(_sender(plan, Counter()), OrderedSink(out), Recorder("edn"), concurrency=3,
                         window=2, deadline_s=DEADLINE_S)
    summary = asyncio.run(runner.run([_entry(i) for i in range(len(plan))]))
    records = read_all(out.getvalue())
    assert [r[K_INDEX] for r in records] == list(range(6))  # the window of 2 never stalls on a gap
    assert summary.recorded == 6 and summary.complete
    assert summary.outcomes == Counter({"ok": 2, "internal": 3, "timeout": 1})
    assert records[1][K_TYPE] == "KeyError"
    assert records[2][kw("vllm/timeout-phase")] == kw("total")
    assert "while writing the record" in records[4][kw("vllm/message")]


def test_an_internal_error_says_the_type_and_message() -> None:
    err = InternalError.from_exception(ValueError("bad thing"))
    assert err.to_edn()[K_ERROR] == kw("internal")
    assert err.to_edn()[K_TYPE] == "ValueError" and err.message == "ValueError: bad thing"
    assert InternalError.from_exception(BrokenStr()).message.endswith("BrokenStr")


def test_a_three_request_run_with_a_surrogate_pair_gives_three_records(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "in.edn"
    lines = ['{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "q%d"}]}' % i for i in range(3)]
    lines[1] = '{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "smile \\uD83D\\uDE00"}]}'
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with FaultServer() as server:
        code = main(["run", str(path), "--base-url", server.base_url, "-b", "llamacpp", "--no-progress",
                     "--timeout", "10"])
    out, err = capsys.readouterr()
    records = read_all(out)
    assert [r[K_INDEX] for r in records] == [0, 1, 2]
    assert "never retrieved" not in err and "Traceback" not in err
    assert "3 records" in err
    assert code in (0, 1)
