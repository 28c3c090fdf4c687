"""The EDN descriptions in `schemas/`, generated from the code so the two cannot drift.

`python -m kotoba_vllm._schema --write` rewrites them; `tests/test_schemas.py` fails when
a file differs from what the code says. Each file names the code it comes from: a key
table (`_typed`) where the code has one, else what the code's `to_edn` emits for samples
(`_observed`, `_samples`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

from .._fields import FIELDS as ENGINE_FIELDS
from .._fields import EXTRA_BODY, EXTRA_HEADERS, REFUSED_BODY_KEYS, REFUSED_HEADERS, On, fields_on
from .._edn import Edn, Keyword, kw, pretty
from .._model import (CacheResetRequest, ChatRequest, Choice, ClassifyRequest, ClassifyResponse, ClassifyResult,
                      CompletionRequest, ContentPart, ControlResponse, DetokenizeRequest, EmbeddingRequest, Figure,
                      GenerateRequest, LoraAdapter, LoraAdaptersResponse, LoraListRequest, LoraLoadRequest, LoraScale,
                      LoraScaleRequest, LoraUnloadRequest, Message, PoolingRequest, PoolingResponse, RerankRequest,
                      RerankResponse, RerankResult, Response, Sampling, ScoreRequest, ScoreResponse, SlotRequest,
                      StreamDelta, Timings, TokenizeRequest, ToolCall, Usage)
from .._sampling import KNOBS_BY_ATTR, SAMPLING_TABLE
from ..capacity import VERDICTS, CapacityAnswer, Evidence, PoolCapacity, Queue, Slots
from ..dialects import DIALECTS, Dialect
from ..dialects._endpoints import OPTIONS
from ..distributed._spec import KIND_TEXT, KOTODAMA_ALIASES, TABLES
from ..pool import PoolConfig
from ..server_config import FIELDS, READS
from . import _samples
from ._engine_docs import DOCS_DIR, engine_docs
from ._observed import observe
from ._typed import codec_shapes, kind_shapes

SHAPES = (ChatRequest, CompletionRequest, GenerateRequest, EmbeddingRequest, TokenizeRequest, DetokenizeRequest,
          RerankRequest, ScoreRequest, ClassifyRequest, PoolingRequest, LoraListRequest, LoraLoadRequest,
          LoraUnloadRequest, LoraScale, LoraScaleRequest, CacheResetRequest, SlotRequest,
          Message, ContentPart, ToolCall, Sampling, Response, Choice, Usage, Timings, Figure, StreamDelta,
          RerankResponse, RerankResult, ScoreResponse, ClassifyResponse, ClassifyResult, PoolingResponse,
          LoraAdaptersResponse, LoraAdapter, ControlResponse)
SCHEMA_DIR = Path(__file__).resolve().parent.parent.parent / "schemas"
REQUEST_REF = "shapes.edn (a request map)"


def shapes() -> dict[Keyword, Edn]:
    out = codec_shapes(SHAPES)
    out[kw("shape/sampling-table")] = [
        {kw("schema/key"): kw(k.key), kw("schema/wire"): k.wire, kw("schema/min"): k.lo, kw("schema/max"): k.hi}
        for k in SAMPLING_TABLE]
    return out


def _sorted_keywords(names: Iterable[str]) -> list[Keyword]:
    return [kw(n) for n in sorted(names)]


def engine(d: Dialect) -> dict[Keyword, Edn]:

    return {
        kw("engine/name"): kw(d.name),
        kw("engine/routes"): {kw(ep): path for ep, path in d.routes.items()},
        kw("engine/models-path"): d.models_path,
        kw("engine/health-path"): d.health_path,
        kw("engine/endpoint-options"): _sorted_keywords(OPTIONS[a][0] for a in d.endpoint_options),
        kw("engine/sampling"): {kw(ep): _sorted_keywords(KNOBS_BY_ATTR[a].key for a in attrs_)
                                for ep, attrs_ in d.sampling_support.items()},
        kw("engine/wire-names"): {kw(ep): {kw(KNOBS_BY_ATTR[a].key): w for a, w in names.items()}
                                  for ep, names in d.wire_names.items()},
        kw("engine/content-parts"): [kw(t) for t in sorted(d.part_types)],
        kw("engine/fields"): {kw(k): engine_field(where) for k, (_, where) in sorted(fields_on(d.name).items())},
        kw("engine/request-id"): {kw("engine/body"): d.request_id_field, kw("engine/header"):
                                  "X-Request-Id" if d.request_id_header else None},
    }


def engine_field(where: On) -> dict[Keyword, Edn]:
    out: dict[Keyword, Edn] = {kw("engine/wire"): where.wire, kw("engine/routes"): [kw(r) for r in sorted(where.routes)]}
    if where.sampling:
        out[kw("engine/generate-sampling-params")] = where.native or where.wire
    return out


def fields() -> dict[Keyword, Edn]:
    return {kw("fields/namespaces"): {
                kw("vllm"): "a field several engines accept (checked per engine), and the library's own keys",
                kw("vllm.engine"): "a field only vLLM accepts", kw("sglang"): "a field only SGLang accepts",
                kw("llamacpp"): "a field only llama.cpp's server accepts"},
            kw("fields/fields"): [{kw("field/key"): kw(f.key), kw("field/kwarg"): f.kwarg, kw("field/type"): f.kind.name,
                                   kw("field/min"): f.lo, kw("field/max"): f.hi, kw("field/doc"): f.doc,
                                   kw("field/engines"): {kw(e): engine_field(o) for e, o in f.engines.items()}}
                                  for f in ENGINE_FIELDS],
            kw("fields/pass-through"): {kw(EXTRA_BODY): "a map merged into the JSON body verbatim (a :warn per "
                                        "key; a key the SDK renders is an error)",
                                        kw(EXTRA_HEADERS): "a map of header name to string value",
                                        kw("fields/refused-headers"): sorted(REFUSED_HEADERS),
                                        kw("fields/refused-body-keys"): sorted(REFUSED_BODY_KEYS)}}


def capacity() -> dict[Keyword, Edn]:

    out = codec_shapes((CapacityAnswer, Slots, Queue, Evidence, PoolCapacity))
    out[kw("shape/verdicts")] = [kw(v) for v in VERDICTS]
    return out


def pool() -> dict[Keyword, Edn]:

    return codec_shapes((PoolConfig,))


def distributed() -> dict[Keyword, Edn]:

    out = kind_shapes(TABLES, KIND_TEXT)
    out[kw("shape/kotodama-aliases")] = {kw(a): kw(c) for a, c in KOTODAMA_ALIASES.items()}
    out[kw("shape/Plan")] = observe(_samples.plan_samples())
    return out


def cassette() -> dict[Keyword, Edn]:
    return {kw("shape/Cassette"): observe(_samples.cassette_samples(),
                                          {"call/request": REQUEST_REF, "cassette/expect": "kotoba_vllm/cassettes/"
                                                                                          "_expect.py (per cassette)"})}


def batch() -> dict[Keyword, Edn]:
    return {kw("shape/BatchSummary"): observe(_samples.batch_samples())}


def ray_batch() -> dict[Keyword, Edn]:
    from ..ray._rows import COLUMNS, INDEX  # the ray extra: only when the schemas are written

    return {kw("shape/RaySummary"): observe(_samples.ray_summary_samples()),
            kw("shape/RayRow"): {kw(f"column/{name}"): typ for name, typ in {INDEX: "int64", **COLUMNS}.items()}}


def server_config() -> dict[Keyword, Edn]:
    return {kw("shape/ServerConfig"): observe(_samples.server_config_samples(),
                                              {"config/fields": "a map of :config/<field> (below) -> a field"}),
            kw("shape/fields"): {kw("config/" + n): means for n, means in FIELDS.items()},
            kw("shape/field"): "{:config/value v :config/source {:config/path p :config/key [k ..]} :config/means "
                               "s} or {:config/value v :config/derived-from [source ..] :config/how s} (reported), "
                               ":unreported (the engine does not say), or {:config/unmeasured \"why\"}",
            kw("shape/sources"): {kw(e): {kw("config/" + n): f"{r.path} {'.'.join(map(str, r.key))}"
                                         for n, r in rows.items()} for e, rows in READS.items()}}


def bench() -> dict[Keyword, Edn]:
    return {kw("shape/bench-result"): observe(_samples.bench_samples())}


# file -> (what it describes and where from, the generator)
FILES: dict[str, tuple[str, Callable[[], dict[Keyword, Edn]]]] = {
    "shapes.edn": ("Generated from kotoba_vllm/_model.py", shapes),
    "capacity.edn": ("Capacity answers (DESIGN §4). Generated from the key table in kotoba_vllm/capacity/"
                     "_answer.py", capacity),
    "pool.edn": ("The pool file (`--pool FILE`). Generated from the key table of kotoba_vllm/pool.py PoolConfig",
                 pool),
    "distributed.edn": ("The distributed spec (key tables of kotoba_vllm/distributed/_spec.py, with the accepted "
                        ":kotodama/* aliases)\n;; and the plan (observed: what Plan.to_edn writes for sample specs)",
                        distributed),
    "cassette.edn": ("A cassette file. Observed: what Cassette.to_edn writes for every cassette in tests/cassettes"
                     " and the base64 branches", cassette),
    "batch.edn": ("The batch summary. Observed: what BatchSummary.to_edn writes for sample runs", batch),
    "ray.edn": ("`run --ray`: summary.edn (observed: what kotoba_vllm/ray/_driver.py summary_edn writes) and the "
                "columns\n;; each output row adds to its input row (kotoba_vllm/ray/_rows.py COLUMNS, Arrow types)",
                ray_batch),
    "fields.edn": ("Every engine field beyond the sampling table: its key, keyword argument, type, bounds and where "
                   "each engine takes it.\n;; Generated from kotoba_vllm/_fields.py", fields),
    "bench.edn": ("One bench result row. Observed: what bench._report.summary_edn writes for sample rows", bench),
    "server-config.edn": ("What a server says it runs (`inspect`, `Client.server_config()`). Observed: what "
                          "ServerConfig.to_edn writes\n;; for the recorded answers of each engine; fields and their "
                          "sources from kotoba_vllm/server_config/_read.py", server_config),
}
GEN = "by `python -m kotoba_vllm._schema --write`."


def rendered() -> dict[str, str]:
    files = {rel: f";; {what} {GEN}\n" + pretty(make()) + "\n" for rel, (what, make) in FILES.items()}
    for name, d in DIALECTS.items():
        files[f"engines/{name}.edn"] = (f";; What kotoba-vllm sends to {name}: routes, honoured sampling keys, wire "
                                        f"renames, engine fields.\n;; Generated from kotoba_vllm/dialects/"
                                        f"{name}.py {GEN}\n" + pretty(engine(d)) + "\n")
    return files


def write(root: Path = SCHEMA_DIR, docs: Path = DOCS_DIR) -> None:
    for rel, text in rendered().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    docs.mkdir(parents=True, exist_ok=True)
    for rel, text in engine_docs().items():
        (docs / rel).write_text(text, encoding="utf-8")
