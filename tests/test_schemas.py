"""`schemas/` is generated from the code; this fails when the two drift apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from kotoba_vllm._edn import Keyword, kw, read_all
from kotoba_vllm._schema import SCHEMA_DIR, rendered

ROOT = Path(__file__).resolve().parent.parent
REGEN = "regenerate with `python -m kotoba_vllm._schema --write` and commit schemas/"
FILES = sorted(rendered())


@pytest.mark.parametrize("rel", FILES)
def test_schema_file_matches_the_code(rel: str) -> None:
    path = SCHEMA_DIR / rel
    assert path.exists(), f"schemas/{rel} is missing; {REGEN}"
    on_disk = path.read_text(encoding="utf-8")
    assert on_disk == rendered()[rel], f"schemas/{rel} differs from the code; {REGEN}"


@pytest.mark.parametrize("rel", FILES)
def test_schema_files_are_readable_edn(rel: str) -> None:
    [value] = read_all((SCHEMA_DIR / rel).read_text(encoding="utf-8"), rel)
    assert isinstance(value, dict) and value


def test_every_engine_has_a_schema_file() -> None:
    from kotoba_vllm.dialects import DIALECTS
    assert {f"engines/{n}.edn" for n in DIALECTS} <= set(FILES)
    assert Path(SCHEMA_DIR, "shapes.edn").exists()


# ---------------------------------------------------------------- keys the code writes are in the schema

NEW_FILES = ("capacity.edn", "pool.edn", "distributed.edn", "cassette.edn", "batch.edn", "bench.edn")


def _schema(rel: str) -> dict:
    [value] = read_all((SCHEMA_DIR / rel).read_text(encoding="utf-8"), rel)
    return value


def _schema_keys(v: object) -> set:
    """Every key described anywhere in a schema file (under any :schema/keys)."""
    out: set = set()
    if isinstance(v, dict):
        for k, x in v.items():
            if k == kw("schema/keys"):
                out |= set(x)
            out |= _schema_keys(x)
    elif isinstance(v, list):
        for x in v:
            out |= _schema_keys(x)
    return out


def _emitted_keys(v: object, skip: tuple[str, ...] = ()) -> set:
    """Every namespaced keyword key in an EDN value the code wrote (not below `skip` keys)."""
    out: set = set()
    if isinstance(v, dict):
        for k, x in v.items():
            if isinstance(k, Keyword) and "/" in k.name:
                out.add(k)
                if k.name not in skip:
                    out |= _emitted_keys(x, skip)
    elif isinstance(v, (list, tuple)):
        for x in v:
            out |= _emitted_keys(x, skip)
    return out


def _missing(rel: str, value: object, skip: tuple[str, ...] = ()) -> list[str]:
    return sorted(str(k) for k in _emitted_keys(value, skip) - _schema_keys(_schema(rel)))


def test_every_shape_family_has_a_schema_file() -> None:
    assert set(NEW_FILES) <= set(FILES)
    for rel in NEW_FILES:
        assert _schema_keys(_schema(rel)), rel


def test_a_key_the_schema_does_not_name_is_caught() -> None:
    # The check below is what fails when a field is renamed in code but schemas/ is not regenerated.
    assert _missing("capacity.edn", {kw("capacity/endpoint"): "x", kw("capacity/renamed"): 1}) == [":capacity/renamed"]


def test_capacity_answers_write_only_schema_keys() -> None:
    from kotoba_vllm.capacity import CapacityAnswer, Evidence, PoolCapacity, Queue, Slots

    a = CapacityAnswer("http://h:8080", "slot-available", True, "llamacpp", Slots(2, 1, 1, 0),
                       Queue(1, 0, 4, 0.5, 1), Evidence("/slots", ("/slots",), "2026-01-01T00:00:00Z", 1.0, 2, "n"),
                       "why", True)
    pool = PoolCapacity((a,), "slot-available", True, 1, 0, 0, "2026-01-01T00:00:00Z")
    assert _missing("capacity.edn", pool.to_edn()) == []
    # Every field was set, so the code writes every key the schema names, and no other.
    assert _emitted_keys(pool.to_edn()) == _schema_keys(_schema("capacity.edn"))


def test_pool_schema_keys_are_exactly_the_keys_the_reader_accepts() -> None:
    from kotoba_vllm.pool import load_pool_config, pool_config_from_edn

    keys = _schema_keys(_schema("pool.edn"))
    for k in keys:  # a key the reader rejects as unknown would be a schema key the code does not read
        try:
            pool_config_from_edn({kw("pool/members"): ["http://a:1"], k: object()})
        except ValueError as e:
            assert "unknown key" not in str(e), k
    with pytest.raises(ValueError, match="unknown key"):
        pool_config_from_edn({kw("pool/members"): ["http://a:1"], kw("pool/not-in-schema"): 1})
    [form] = read_all((ROOT / "examples" / "pool.edn").read_text(encoding="utf-8"), "pool.edn")
    assert set(form) <= keys
    load_pool_config(str(ROOT / "examples" / "pool.edn"))


@pytest.mark.parametrize("path", sorted((ROOT / "examples" / "distributed").glob("*.edn")), ids=lambda p: p.name)
def test_distributed_examples_and_their_plans_use_schema_keys(path: Path) -> None:
    from kotoba_vllm.distributed import plan, spec_from_edn
    from kotoba_vllm.distributed._spec import spec_to_edn

    [raw] = read_all(path.read_text(encoding="utf-8"), path.name)
    schema = _schema("distributed.edn")
    aliases = set(schema[kw("shape/kotodama-aliases")])
    assert sorted(str(k) for k in _emitted_keys(raw) - _schema_keys(schema) - aliases) == []
    spec, problems = spec_from_edn(raw)
    assert spec is not None, problems
    assert _missing("distributed.edn", spec_to_edn(spec)) == []
    p, problems = plan(spec)
    if p is not None:
        assert _missing("distributed.edn", p.to_edn()) == []


def test_kotodama_aliases_in_the_schema_are_accepted() -> None:
    from kotoba_vllm.distributed import spec_from_edn

    aliases = _schema("distributed.edn")[kw("shape/kotodama-aliases")]
    assert aliases
    raw = {kw("dist/model"): {kw("model/id"): "m", kw("model/path"): "/m", kw("model/layers"): 4,
                              kw("model/weight-bytes"): 10},
           kw("dist/nodes"): [{kw("node/name"): "a", kw("node/address"): "h", kw("node/memory-bytes"): 10**10}]}
    for alias in aliases:
        _, problems = spec_from_edn({**raw, alias: "not-a-valid-value"})
        assert not any(p.code == "dist/unknown-key" for p in problems), alias


def test_cassette_files_use_schema_keys() -> None:
    from kotoba_vllm.cassettes import DEFAULT_ROOT

    skip = ("call/request", "cassette/expect")  # described in shapes.edn / per cassette
    files = sorted(DEFAULT_ROOT.glob("*/*.edn"))
    assert files
    for f in files:
        [raw] = read_all(f.read_text(encoding="utf-8"), f.name)
        assert _missing("cassette.edn", raw, skip) == [], f


def test_batch_and_bench_summaries_write_only_schema_keys() -> None:
    from kotoba_vllm.batch._runner import BatchSummary
    from kotoba_vllm.bench._report import summary_edn
    from kotoba_vllm.bench._stats import summarize_group

    assert _missing("batch.edn", BatchSummary(interrupted=True).to_edn()) == []
    assert _missing("bench.edn", summary_edn(summarize_group("u", "u", 4, []))) == []
