"""docs/engines/<engine>.md: what each key and endpoint becomes on one engine's wire, from the tables
(the dialect's routes and sampling support, `_fields.FIELDS`, the engine-field tables read from the
engine's code). Written by `python -m kotoba_vllm._schema --write`; tests/test_schemas.py holds them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from .._edn import kw, read_file
from .._fields import BY_KEY, ENGINE_OWN, EXTRA_BODY, EXTRA_HEADERS, UNSUPPORTED, fields_on
from .._model import ChatRequest, CompletionRequest, GenerateRequest, Message, Request, Sampling
from .._sampling import KNOBS_BY_ATTR
from ..dialects import DIALECTS, Dialect

DOCS_DIR = Path(__file__).resolve().parent.parent.parent / "docs" / "engines"
TABLES_DIR = Path(__file__).resolve().parent.parent.parent / "schemas" / "engine-fields"
TITLES = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp (llama-server)",
          "openai": "Any OpenAI-compatible server"}
NATIVE = {"sglang": "`/generate` (sampling fields inside `sampling_params`)", "llamacpp": "`/completion`"}


def _versions(engine: str) -> list[str]:
    return sorted(p.stem for p in TABLES_DIR.glob(f"{engine}-*.edn"))


def _table_count(stem: str) -> str:
    value = read_file(str(TABLES_DIR / f"{stem}.edn"))[0].value
    requests = value[kw("fields/requests")] if isinstance(value, dict) else {}
    return ", ".join(f"{ep.name} {len(r[kw('fields/fields')])}" for ep, r in requests.items())


def _routes(d: Dialect) -> list[str]:
    out = ["| endpoint (`:vllm/endpoint`) | route |", "|---|---|"]
    out += [f"| `:{ep}` | `{path}` |" for ep, path in d.routes.items()]
    return out


# Any: each value goes to its own Sampling attribute, of its own type (attrs.evolve)
_SAMPLES: dict[str, Any] = {"temperature": 0.5, "top_p": 0.5, "top_k": 5, "min_p": 0.1, "max_tokens": 5, "n": 1, "best_of": 2,
            "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1, "stop": "x", "seed": 1,
            "logprobs": 2, "guided_json": {"type": "object"}, "guided_regex": "a+", "guided_choice": ("a", "b")}


def _wire_keys(d: Dialect, ep: str, sampling: Sampling | None) -> set[str]:
    """The body keys (SGLang /generate: `sampling_params.<key>` too) rendering one request puts on the wire."""
    req: Request = (ChatRequest(messages=(Message(role="user", content="x"),), sampling=sampling) if ep == "chat"
                    else CompletionRequest(prompt="x", sampling=sampling) if ep == "completion"
                    else GenerateRequest(prompt="x", sampling=sampling))
    rendered = d.render(req).body
    body = rendered if isinstance(rendered, dict) else {}  # chat, completion, generate: a JSON object
    params = body.get("sampling_params")
    return set(body) | ({f"sampling_params.{k}" for k in params} if isinstance(params, dict) else set())


def _sampling(d: Dialect) -> list[str]:
    """Each knob as this dialect renders it: found by rendering a request with and without it."""
    out = ["| key | wire fields | routes |", "|---|---|---|"]
    for attr, knob in KNOBS_BY_ATTR.items():
        rows: dict[str, list[str]] = {}
        for ep, honoured in d.sampling_support.items():
            if attr not in honoured:
                continue
            base = Sampling(n=2, temperature=1.0) if attr == "best_of" else Sampling()
            s = attrs.evolve(base, **{attr: _SAMPLES.get(attr)})
            added = _wire_keys(d, ep, s) - _wire_keys(d, ep, base)
            rows.setdefault(", ".join(f"`{k}`" for k in sorted(added)), []).append(ep)
        for wires, eps in rows.items():
            out.append(f"| `:{knob.key}` | {wires} | {', '.join(eps)} |")
    return out


def _fields(d: Dialect) -> list[str]:
    out = ["| key | keyword argument | wire field | routes | type | what it does |", "|---|---|---|---|---|---|"]
    for key, (f, where) in sorted(fields_on(d.name).items()):
        wire = f"`{where.wire}`"
        if where.sampling:
            wire += f" (`/generate`: `sampling_params.{where.native or where.wire}`)"
        bounds = "" if f.lo is None and f.hi is None else \
            f" in [{'-inf' if f.lo is None else format(f.lo, 'g')}, {'inf' if f.hi is None else format(f.hi, 'g')}]"
        out.append(f"| `:{key}` | `{f.kwarg}=` | {wire} | {', '.join(sorted(where.routes))} | {f.kind.name}{bounds} "
                   f"| {f.doc} |")
    return out


def _others(engine: str) -> list[str]:
    shared = sorted(k for k, f in BY_KEY.items() if engine not in f.engines and k.startswith("vllm/"))
    return [", ".join(f"`:{k}`" for k in shared)] if shared else ["(none)"]


def engine_doc(name: str) -> str:
    d = DIALECTS[name]
    lines = [f"# {TITLES[name]}: what each key becomes on the wire", "",
             "Generated from the tables by `python -m kotoba_vllm._schema --write` (kotoba_vllm/dialects/"
             f"{name}.py, kotoba_vllm/_fields.py, schemas/engine-fields/); do not edit by hand.", ""]
    versions = _versions(name)
    if versions:
        lines += ["Fields read from the engine's own code: " + "; ".join(f"`schemas/engine-fields/{v}.edn` "
                                                                         f"({_table_count(v)})" for v in versions)
                  + ". Every field of their chat and completion requests (SGLang's /generate and llama.cpp's /completion "
                  "too) is rendered from a key below or left out on purpose, with the reason (at the end): "
                  "tests/test_engine_fields.py holds it.", ""]
    lines += ["## Routes", "", *_routes(d), ""]
    if name in NATIVE:
        lines += [f"`:generate` is the engine's native route, {NATIVE[name]}.", ""]
    lines += ["Chat content parts (`:vllm/type` of a part) it takes: "
              + ", ".join(f"`:{t}`" for t in sorted(d.part_types))
              + "; another is a problem naming part and engine.", ""]
    lines += ["## Sampling keys (`:vllm/sampling`, or keyword arguments named as the wire field)", "", *_sampling(d), ""]
    lines += ["## Engine fields (top level of the request map)", "",
              "Namespaces: `:vllm/*` for a field several engines accept (checked for this engine), `:vllm.engine/*` "
              "for vLLM-only, `:sglang/*`, `:llamacpp/*`. A key this engine lacks is a validation problem naming "
              "key and engine; nothing is sent.", "", *_fields(d), ""]
    rid = []
    if d.request_id_field:
        rid.append(f"the body field `{d.request_id_field}`")
    if d.request_id_header:
        rid.append("the `X-Request-Id` header")
    lines += ["## Request id and pass-through", "",
              f"`:vllm/request-id` (`request_id=`) is sent as {' and '.join(rid)}; the answer's `x-request-id` header "
              "comes back as `:vllm/server-request-id` (on the response and on an error), its body `id` as `:vllm/id`.",
              "",
              f"`:{EXTRA_BODY}` (`extra_body=`) is merged into the JSON body verbatim, one `:warn` per key (unchecked); "
              "a key the SDK already rendered is an error, never overwritten"
              + (", and on `/generate` a key of SGLang's `SamplingParams` goes inside `sampling_params`"
                 if name == "sglang" else "") + f". `:{EXTRA_HEADERS}` (`extra_headers=`) adds headers. Neither may "
              "carry the API key or a URL (`authorization`, `api_key`, `base_url`, ... are refused).", ""]
    lines += ["## Shared fields this engine does not take", "", *_others(name), ""]
    own = {**ENGINE_OWN["common"], **ENGINE_OWN.get(name, {})}
    if versions:
        lines += ["## Engine fields the client renders from its own keys", "", "| wire field | from |", "|---|---|"]
        lines += [f"| `{w}` | {how} |" for w, how in sorted(own.items())]
        lines.append("")
    left = UNSUPPORTED.get(name, {})
    if left:
        lines += ["## Left out on purpose", "", "| wire field | reason | why |", "|---|---|---|"]
        lines += [f"| `{w}` | {reason} | {why} |" for w, (reason, why) in sorted(left.items())]
        lines.append("")
    return "\n".join(lines)


def engine_docs() -> dict[str, str]:
    return {f"{name}.md": engine_doc(name) for name in DIALECTS}
