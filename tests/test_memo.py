"""`_memo.IdentityMemo`: read as a plain dict of ids, exact because it holds every key it keeps."""

from __future__ import annotations

import gc

from kotoba_vllm._memo import IdentityMemo


class _Key:
    pass


def test_an_id_is_never_answered_for_another_object_while_its_entry_lives() -> None:
    memo: IdentityMemo[_Key, str] = IdentityMemo(1024)
    ids = set()
    for _ in range(100):
        key = _Key()
        memo.keep(key, "kept")
        ids.add(id(key))
        del key  # our only reference: the memo's is what keeps the id from being reused
    gc.collect()
    strangers = [_Key() for _ in range(1000)]  # without the hold, CPython hands freed ids straight back
    assert all(memo.get(id(s)) is None for s in strangers)
    assert len(memo) == 100 and all(memo.get(i) == "kept" for i in ids)


def test_a_full_memo_starts_over_and_lets_its_keys_go() -> None:
    memo: IdentityMemo[_Key, int] = IdentityMemo(2)
    a, b, c = _Key(), _Key(), _Key()
    memo.keep(a, 1)
    memo.keep(b, 2)
    assert memo.get(id(a)) == 1 and memo.get(id(b)) == 2
    memo.keep(c, 3)  # full: everything before is forgotten, held keys too
    assert memo.get(id(a)) is None and memo.get(id(b)) is None and memo.get(id(c)) == 3
    assert len(memo) == 1
    memo.clear()
    assert memo.get(id(c)) is None and len(memo) == 0
