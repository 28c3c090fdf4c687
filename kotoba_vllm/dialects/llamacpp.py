"""llama.cpp's `llama-server`: its OpenAI-compatible routes and the native `/completion`.

Facts this module encodes: the native route takes `n_predict`, `json_schema` (an object),
`grammar` (GBNF), `cache_prompt`, `id_slot`, `n_probs`; the repetition penalty is
`repeat_penalty`; one choice per request; every answer carries `timings` (prompt and
predicted tokens and ms, `cache_n`), which is the server's own prefill/decode split.
A 503 while the model loads is not-ready, not admission. `:vllm/guided-choice` and
`:vllm/guided-regex` become a GBNF `grammar` (the regex translated by `_regex_gbnf`).
"""

from __future__ import annotations

import json
from typing import ClassVar, Mapping, cast

from .._fields import render_fields
from .._codec import json_to_edn
from .._edn import Edn
from .._errors import ProtocolError, ValidationError
from .._model import (Choice, DetokenizeRequest, GenerateRequest, Request, Response, Sampling, StreamDelta,
                      TokenizeRequest, Usage)
from .._problems import Problem
from .._timings import ClientClock, ServerTimings, build_timings, llamacpp_server_timings
from .openai import ChunkStream, Dialect, int_or_none, schema_json, str_or_none
from ._http import HttpRequest
from ._shapes import LlamacppCompletionJson
from ._regex_gbnf import Untranslatable, gbnf_literal, overlong_prone, regex_to_gbnf

LLAMACPP_SAMPLING = frozenset({"temperature", "top_p", "top_k", "min_p", "max_tokens", "n", "presence_penalty",
                               "frequency_penalty", "repetition_penalty", "stop", "seed", "logprobs", "guided_json",
                               "guided_regex", "guided_choice"})
RENAMES = {"repetition_penalty": "repeat_penalty"}
NATIVE_NAMES = {"max_tokens": "n_predict", "repetition_penalty": "repeat_penalty", "logprobs": "n_probs"}
ALL_ROUTES = frozenset({"chat", "completion", "generate"})

# llama.cpp's stop_type -> OpenAI finish reason
STOP_TYPES = {"eos": "stop", "word": "stop", "limit": "length", "none": None}


def choice_grammar(choices: tuple[str, ...]) -> str:
    """GBNF accepting exactly one of the choices."""
    return "root ::= " + " | ".join(gbnf_literal(c) for c in choices)


def regex_problem(pattern: str, engine: str) -> Problem | None:
    """The validation problem for a regex llama.cpp's grammars cannot express exactly, if any."""
    grammar = regex_to_gbnf(pattern)
    if isinstance(grammar, Untranslatable):
        return untranslatable(grammar, engine)
    if overlong_prone(pattern):
        return Problem("warn", "engine/overlong-utf8",
                       ":vllm/guided-regex has a class spanning several UTF-8 lengths (`.`, Unicode \\d or \\w, a wide "
                       f"negated class); {engine} may let a model that emits raw bytes produce an overlong sequence, "
                       "returned as U+FFFD. Use [0-9], (?a) or a narrower class to rule it out",
                       field="vllm/guided-regex", engine=engine)
    return None


def untranslatable(why: Untranslatable, engine: str) -> Problem:
    if why.invalid:
        msg = f":vllm/guided-regex is not a valid regular expression ({why.construct}), so no {engine} grammar"
    else:
        msg = (f":vllm/guided-regex uses {why.construct}; {engine} enforces a regex as a grammar, and no grammar "
               "expresses that exactly")
    return Problem("error", "engine/unsupported", msg, field="vllm/guided-regex", engine=engine)


def structured_grammar(s: Sampling) -> str | None:
    """The GBNF grammar standing for :vllm/guided-choice or :vllm/guided-regex, if either is set."""
    if s.guided_choice is not None:
        return choice_grammar(s.guided_choice)
    if s.guided_regex is not None:
        grammar = regex_to_gbnf(s.guided_regex)
        if isinstance(grammar, Untranslatable):  # render without validate first: still never a looser grammar
            raise ValidationError([untranslatable(grammar, "llamacpp")])
        return grammar
    return None


class LlamacppDialect(Dialect):
    name: ClassVar[str] = "llamacpp"
    routes: ClassVar[dict[str, str]] = {
        "chat": "/v1/chat/completions",
        "completion": "/v1/completions",
        "embedding": "/v1/embeddings",
        "generate": "/completion",
        "tokenize": "/tokenize",
        "detokenize": "/detokenize",
        "rerank": "/v1/rerank",  # with --rerank (pooling rank) only
        "lora-list": "/lora-adapters",
        "lora-scale": "/lora-adapters",
        "slot": "/slots/{slot_id}",  # with --slot-save-path only
    }
    health_path: ClassVar[str] = "/health"
    # the content part types its chat parser takes (read from its code)
    part_types: ClassVar[frozenset[str]] = frozenset({"text", "image-url", "input-audio", "input-video", "video-url"})
    endpoint_options: ClassVar[frozenset[str]] = frozenset({"encoding_format", "top_n"})  # no dimensions
    sampling_support: ClassVar[dict[str, frozenset[str]]] = {
        "chat": LLAMACPP_SAMPLING, "completion": LLAMACPP_SAMPLING, "generate": LLAMACPP_SAMPLING}
    wire_names: ClassVar[dict[str, dict[str, str]]] = {"chat": RENAMES, "completion": RENAMES}
    def problems(self, req: Request) -> list[Problem]:
        out = super().problems(req)
        s: Sampling | None = getattr(req, "sampling", None)
        if s is not None and s.n is not None and s.n != 1:
            out.append(Problem("error", "engine/unsupported", "llama-server answers one choice per request; "
                               f":vllm/n {s.n} would be rejected", field="vllm/n", engine=self.name))
        for attr, key in (("guided_choice", "vllm/guided-choice"), ("guided_regex", "vllm/guided-regex")):
            if s is not None and getattr(s, attr) is not None and "llamacpp/grammar" in req.extras:
                out.append(Problem("error", "sampling/conflict", f":{key} becomes a grammar on llama.cpp and "
                                   "cannot be combined with :llamacpp/grammar", field=key, engine=self.name))
        if s is not None and s.guided_regex is not None and req.endpoint in self.routes:
            problem = regex_problem(s.guided_regex, self.name)
            if problem is not None:
                out.append(problem)
        return out

    def render_structured(self, s: Sampling, ep: str, body: dict[str, object]) -> None:
        if s.guided_json is not None:
            if ep == "chat":
                body["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema_json(s.guided_json)}}
            else:
                body["json_schema"] = schema_json(s.guided_json)
        grammar = structured_grammar(s)
        if grammar is not None:
            body["grammar"] = grammar

    def render_generate(self, req: Request) -> HttpRequest:
        assert isinstance(req, GenerateRequest)
        body: dict[str, object] = {"prompt": req.prompt if isinstance(req.prompt, str) else list(req.prompt)}
        s = req.sampling
        if s is not None:
            for attr in ("temperature", "top_p", "top_k", "min_p", "max_tokens", "presence_penalty",
                         "frequency_penalty", "repetition_penalty", "stop", "seed", "logprobs"):
                v = getattr(s, attr)
                if v is None:
                    continue
                if attr == "stop":
                    v = [v] if isinstance(v, str) else list(v)
                if attr == "logprobs":
                    v = 1 if v is True else 0 if v is False else v
                body[NATIVE_NAMES.get(attr, attr)] = v
            if s.guided_json is not None:
                body["json_schema"] = schema_json(s.guided_json)
            grammar = structured_grammar(s)
            if grammar is not None:
                body["grammar"] = grammar
        if req.extras:
            render_fields(self.name, "generate", req.extras, body)
        if req.stream:
            body["stream"] = True
        return HttpRequest("POST", self.routes["generate"], body, bool(req.stream))

    def render_tokenize(self, req: TokenizeRequest) -> HttpRequest:
        body: dict[str, object] = {"content": req.text}
        if req.add_special is not None:
            body["add_special"] = req.add_special
        return HttpRequest("POST", self.routes["tokenize"], body)

    def render_detokenize(self, req: DetokenizeRequest) -> HttpRequest:
        return HttpRequest("POST", self.routes["detokenize"], {"tokens": list(req.tokens)})

    def server_timings(self, obj: Mapping[str, object]) -> ServerTimings | None:
        return llamacpp_server_timings(obj.get("timings"))

    def response_extras(self, obj: Mapping[str, object]) -> dict[str, Edn]:
        out: dict[str, Edn] = {}
        t = obj.get("timings")
        if isinstance(t, dict):
            out["llamacpp/timings"] = json_to_edn(t)
        for k, name in (("id_slot", "llamacpp/id-slot"), ("tokens_cached", "llamacpp/tokens-cached"),
                        ("truncated", "llamacpp/truncated"), ("stop_type", "llamacpp/stop-type")):
            v = obj.get(k)
            if isinstance(v, (int, str, bool)):
                out[name] = v
        return out

    def native_usage(self, obj: Mapping[str, object]) -> Usage | None:
        p, c = int_or_none(obj.get("tokens_evaluated")), int_or_none(obj.get("tokens_predicted"))
        if p is None and c is None:
            return None
        timings = obj.get("timings")
        t = timings if isinstance(timings, dict) else {}
        return Usage(prompt_tokens=p, completion_tokens=c, total_tokens=(p or 0) + (c or 0),
                     cached_tokens=int_or_none(t.get("cache_n")))

    def parse_generate(self, req: Request, answer: Mapping[str, object], endpoint_url: str | None,
                       clock: ClientClock | None) -> Response:
        obj = cast(LlamacppCompletionJson, answer)
        if "content" not in obj:
            raise ProtocolError("llama.cpp /completion answer has no content", offending=json.dumps(obj)[:500],
                                endpoint=endpoint_url)
        usage = self.native_usage(obj)
        choice = Choice(index=0, text=obj.get("content"), finish_reason=STOP_TYPES.get(obj.get("stop_type") or "none"))
        return Response(text=choice.text, choices=(choice,), model=str_or_none(obj.get("model")), usage=usage,
                        backend=self.name, endpoint="generate", endpoint_url=endpoint_url,
                        timings=build_timings(self.server_timings(obj), usage, clock), request_id=req.request_id,
                        extras=self.response_extras(obj))

    def stream_decoder(self, req: Request, endpoint_url: str | None = None) -> ChunkStream:
        if req.endpoint == "generate":
            return NativeStream(self, req, endpoint_url)
        return ChunkStream(self, req, endpoint_url)


class NativeStream(ChunkStream):
    """`/completion` stream: disjoint `content` pieces; the last chunk has `stop: true` and timings."""

    def __init__(self, dialect: LlamacppDialect, req: Request, endpoint_url: str | None) -> None:
        super().__init__(dialect, req, endpoint_url)
        self.pieces: list[str] = []
        self.last_obj: LlamacppCompletionJson = {}

    payload_key: ClassVar[str] = "content"

    @property
    def partial_text(self) -> str:
        return "".join(self.pieces)

    def chunk(self, payload: Mapping[str, object]) -> list[StreamDelta]:
        obj = cast(LlamacppCompletionJson, payload)
        piece = obj.get("content")
        piece = piece if isinstance(piece, str) else ""
        if piece:
            self.pieces.append(piece)
        fr = None
        if obj.get("stop"):
            self.done = True
            self.last_obj = obj
            fr = STOP_TYPES.get(obj.get("stop_type") or "none")
        if piece or fr is not None:
            return [StreamDelta(delta=piece, finish_reason=fr, index=0)]
        return []

    def response(self, clock: ClientClock | None = None) -> Response:
        d = self.dialect
        assert isinstance(d, LlamacppDialect)
        obj = self.last_obj
        usage = d.native_usage(obj)
        text = self.partial_text
        choice = Choice(index=0, text=text, finish_reason=STOP_TYPES.get(obj.get("stop_type") or "none"))
        return Response(text=text, choices=(choice,), model=str_or_none(obj.get("model")), usage=usage, backend=d.name,
                        endpoint="generate", endpoint_url=self.endpoint_url,
                        timings=build_timings(d.server_timings(obj), usage, clock), request_id=self.req.request_id,
                        extras=d.response_extras(obj))


DIALECT = LlamacppDialect()
