"""Maps a user builds with `edn_format.loads` or `edn_format.Keyword` (not our reader) work wherever the SDK
takes EDN: requests (typed, sent, validated with their problems keyed), responses, pool files' maps, capacity
answers, distributed specs; and the SDK leaves edn_format's own Keyword class as it found it."""

from __future__ import annotations

import pickle
from pathlib import Path

import edn_format
import pytest
from edn_format import Keyword

from faultserver import FaultServer, chat_answer, reply
from kotoba_vllm import AsyncClient, ChatRequest, Client, Response, ValidationError, from_edn, kw, read_file, to_edn
from kotoba_vllm._requests import request_from_edn
from kotoba_vllm.capacity import CapacityAnswer
from kotoba_vllm.distributed import spec_from_edn
from kotoba_vllm.pool import pool_config_from_edn

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CHAT = ('{:vllm/endpoint :chat :vllm/model "m" :vllm/messages [{:vllm/role :user :vllm/content "hi"}] '
        ':vllm/sampling {:vllm/temperature 0.5 :vllm/max-tokens 4}}')


def test_edn_formats_keyword_class_is_not_patched() -> None:
    from edn_format.edn_lex import BaseEdnType
    assert Keyword.__hash__ is BaseEdnType.__hash__
    assert Keyword.__eq__ is BaseEdnType.__eq__


def test_our_keywords_equal_and_hash_as_edn_formats_both_ways() -> None:
    ours, theirs = kw("vllm/model"), Keyword("vllm/model")
    assert ours == theirs and theirs == ours and not ours != theirs and hash(ours) == hash(theirs)
    assert {theirs: 1}[ours] == 1 and {ours: 2}[theirs] == 2
    assert kw("vllm/model") != Keyword("vllm/prompt") and kw("a") != edn_format.Symbol("a")
    assert isinstance(ours, Keyword) and edn_format.dumps({ours: 1}) == "{:vllm/model 1}"
    assert pickle.loads(pickle.dumps(ours)) is ours  # another process interns afresh (its hashes differ)


def test_a_request_map_from_edn_format_loads_is_the_request_our_reader_reads() -> None:
    theirs = edn_format.loads(CHAT)
    assert not any(type(k) is not Keyword for k in theirs)  # edn_format's own keywords, not ours
    got, problems = request_from_edn(theirs)
    ours, _ = request_from_edn(read_file_text(CHAT))
    assert problems == [] and got == ours and isinstance(got, ChatRequest)
    assert got.sampling is not None and got.sampling.max_tokens == 4


def test_its_problems_name_the_key() -> None:
    bad = edn_format.loads('{:vllm/endpoint :chat :vllm/messages [] :vllm/sampling {:vllm/temperature "hot"}}')
    _, problems = request_from_edn(bad)
    assert [p.field for p in problems] == ["vllm/temperature"]


def test_sync_and_async_clients_send_it() -> None:
    with FaultServer(lambda seen: reply(chat_answer("ok"))) as srv:
        with Client(srv.base_url, backend="vllm") as c:
            assert c.send(edn_format.loads(CHAT)).text == "ok"
            with pytest.raises(ValidationError, match="vllm/max-tokens"):
                c.send(edn_format.loads(CHAT.replace(":vllm/max-tokens 4", ":vllm/max-tokens -4")))
        bodies = [s.json() for s in srv.seen]
    assert bodies[0]["max_tokens"] == 4 and bodies[0]["messages"] == [{"role": "user", "content": "hi"}]


async def test_the_async_client_sends_it() -> None:
    with FaultServer(lambda seen: reply(chat_answer("ok"))) as srv:
        async with AsyncClient(srv.base_url, backend="vllm") as c:
            assert (await c.send(edn_format.loads(CHAT))).text == "ok"


def test_a_response_a_pool_a_capacity_answer_and_a_spec_read_from_its_maps() -> None:
    resp = Response(text="hi", model="m", id="r1")
    assert from_edn(edn_format.loads(edn_format.dumps(to_edn(resp))), Response) == resp
    pool = pool_config_from_edn(edn_format.loads('{:pool/members ["http://a:1" "http://b:2"] :pool/backend :vllm}'))
    assert pool.members == ("http://a:1", "http://b:2") and pool.backend == "vllm"
    cap = CapacityAnswer("http://a:1", "slot-available", True)
    assert CapacityAnswer.from_edn(edn_format.loads(edn_format.dumps(cap.to_edn()))) == cap
    for path in sorted((EXAMPLES / "distributed").glob("*.edn")):
        ours = spec_from_edn(read_file(str(path))[0].value)
        theirs = spec_from_edn(edn_format.loads(path.read_text(encoding="utf-8")))
        assert ours[0] is not None and theirs == ours, path.name


def read_file_text(text: str) -> object:
    from kotoba_vllm import read_forms
    return next(read_forms(text, "<test>")).value
