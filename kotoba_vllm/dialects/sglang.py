"""SGLang: its OpenAI-compatible routes and the native `/generate`.

Facts this module encodes (SGLang 0.5.23, recorded from its real serving layer): `/generate`
takes `sampling_params` with `max_new_tokens`, rejects unknown sampling keys, names the seed
`sampling_seed` and wants `json_schema` as a JSON *string*; it streams **cumulative** text by
default and disjoint pieces with `--incremental-streaming-output` (told apart by `output_ids`
against `meta_info.completion_tokens`); errors inside the stream arrive as `data: {"error": ...}`,
but a scheduler abort (the full queue among them) arrives as a chunk whose
`meta_info.finish_reason` is `{"type": "abort", "status_code": 503, "message": ...}`.
"""

from __future__ import annotations

import json
import re
from typing import ClassVar, Mapping, cast

from .._fields import render_fields
from .._codec import edn_to_json, json_to_edn
from .._edn import Edn
from .._errors import ProtocolError
from .._model import Choice, GenerateRequest, Request, Response, Sampling, StreamDelta, Usage
from .._problems import Problem
from .._timings import ClientClock, ServerTimings, build_timings, sglang_server_timings
from .openai import ChunkStream, Dialect, int_or_none, reason_text, schema_json, str_or_none
from ._http import HttpRequest, ServerError, stream_error
from ._shapes import SglangGenerateJson

SGLANG_OPENAI_SAMPLING = frozenset({"temperature", "top_p", "top_k", "min_p", "max_tokens", "n", "presence_penalty",
                                    "frequency_penalty", "repetition_penalty", "stop", "seed", "logprobs",
                                    "guided_json", "guided_regex", "guided_choice"})
SGLANG_NATIVE_SAMPLING = SGLANG_OPENAI_SAMPLING - {"n"}

# sampling attr -> key inside /generate's sampling_params
NATIVE_NAMES = {"max_tokens": "max_new_tokens", "seed": "sampling_seed"}
# The keys SGLang 0.5.23's SamplingParams takes (schemas/engine-fields/sglang-0.5.23.edn): a pass-through key
# named here goes inside /generate's sampling_params, any other at the top level of the body.
SAMPLING_PARAM_NAMES = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "beam_width", "json_schema",
    "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed", "custom_params", "watermark"})


def choice_regex(choices: tuple[str, ...]) -> str:
    """A regex that matches exactly one of the choices (SGLang has no choice constraint of its own)."""
    return "(" + "|".join(re.escape(c) for c in choices) + ")"


class SglangDialect(Dialect):
    name: ClassVar[str] = "sglang"
    routes: ClassVar[dict[str, str]] = {
        "chat": "/v1/chat/completions",
        "completion": "/v1/completions",
        "embedding": "/v1/embeddings",
        "generate": "/generate",
        "tokenize": "/tokenize",
        "detokenize": "/detokenize",
        "rerank": "/v1/rerank",  # a cross-encoder served with --is-embedding
        "lora-list": "/v1/models",
        "lora-load": "/load_lora_adapter",
        "lora-unload": "/unload_lora_adapter",
        "cache-reset": "/flush_cache",  # refused (400, text) while requests run or wait
    }
    health_path: ClassVar[str] = "/health"
    # the content part types its chat parser takes (read from its code)
    part_types: ClassVar[frozenset[str]] = frozenset({"text", "image-url", "audio-url", "video-url", "input-audio"})
    # Read from its serving_embedding / serving_rerank: each embedding answer is built from the vector alone
    # (no dimensions, no base64), every document is ranked and returned (no top_n).
    endpoint_options: ClassVar[frozenset[str]] = frozenset()
    sampling_support: ClassVar[dict[str, frozenset[str]]] = {
        "chat": SGLANG_OPENAI_SAMPLING, "completion": SGLANG_OPENAI_SAMPLING, "generate": SGLANG_NATIVE_SAMPLING}
    request_id_field: ClassVar[str | None] = "rid"

    def problems(self, req: Request) -> list[Problem]:
        out = super().problems(req)
        if req.request_id is not None and "sglang/rid" in req.extras:
            out.append(Problem("error", "request/conflict", ":vllm/request-id already sets SGLang's rid; drop "
                               ":sglang/rid", field="sglang/rid", engine=self.name))
        return out

    def sampling_params_of(self, http: HttpRequest) -> tuple[dict[str, object] | None, frozenset[str]]:
        params = http.body.get("sampling_params") if isinstance(http.body, dict) and http.path == self.routes["generate"] \
            else None
        return (params, SAMPLING_PARAM_NAMES) if isinstance(params, dict) else (None, frozenset())

    def render_structured(self, s: Sampling, ep: str, body: dict[str, object]) -> None:
        if s.guided_json is not None:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "output", "schema": schema_json(s.guided_json)}}
        if s.guided_regex is not None:
            body["regex"] = s.guided_regex
        if s.guided_choice is not None:
            body["regex"] = choice_regex(s.guided_choice)

    def render_generate(self, req: Request) -> HttpRequest:
        assert isinstance(req, GenerateRequest)
        body: dict[str, object] = {}
        if isinstance(req.prompt, str):
            body["text"] = req.prompt
        else:
            body["input_ids"] = list(req.prompt)
        params: dict[str, object] = {}
        s = req.sampling
        if s is not None:
            for attr in ("temperature", "top_p", "top_k", "min_p", "max_tokens", "presence_penalty",
                         "frequency_penalty", "repetition_penalty", "stop", "seed"):
                v = getattr(s, attr)
                if v is not None:
                    params[NATIVE_NAMES.get(attr, attr)] = list(v) if isinstance(v, tuple) else v
            if s.guided_json is not None:
                schema = s.guided_json if isinstance(s.guided_json, str) else json.dumps(edn_to_json(s.guided_json))
                params["json_schema"] = schema
            if s.guided_regex is not None:
                params["regex"] = s.guided_regex
            if s.guided_choice is not None:
                params["regex"] = choice_regex(s.guided_choice)
            if s.logprobs is not None and s.logprobs is not False:
                body["return_logprob"] = True
                if s.logprobs is not True:
                    body["top_logprobs_num"] = s.logprobs
        body["sampling_params"] = params
        if req.request_id is not None:
            body["rid"] = str(req.request_id)
        if req.extras:
            render_fields(self.name, "generate", req.extras, body, params)
        if req.stream:
            body["stream"] = True
        return HttpRequest("POST", self.routes["generate"], body, bool(req.stream))

    def detokenized_text(self, obj: Mapping[str, object]) -> str:
        return super().detokenized_text(obj)

    def response_extras(self, obj: Mapping[str, object]) -> dict[str, Edn]:
        meta = obj.get("meta_info")
        return {"sglang/meta-info": json_to_edn(meta)} if isinstance(meta, dict) else {}

    def server_timings(self, obj: Mapping[str, object]) -> ServerTimings | None:
        return sglang_server_timings(obj.get("meta_info"))

    def native_usage(self, obj: Mapping[str, object]) -> Usage | None:
        meta = obj.get("meta_info")
        if not isinstance(meta, dict):
            return None
        p, c = int_or_none(meta.get("prompt_tokens")), int_or_none(meta.get("completion_tokens"))
        return Usage(prompt_tokens=p, completion_tokens=c, total_tokens=(p + c) if p is not None and c is not None
                     else None, cached_tokens=int_or_none(meta.get("cached_tokens")))

    def parse_generate(self, req: Request, answer: Mapping[str, object], endpoint_url: str | None,
                       clock: ClientClock | None) -> Response:
        obj = cast(SglangGenerateJson, answer)
        if "text" not in obj:
            raise ProtocolError("SGLang /generate answer has no text", offending=json.dumps(obj)[:500],
                                endpoint=endpoint_url)
        meta = obj.get("meta_info") or {}
        abort = abort_error(meta.get("finish_reason"), obj, endpoint_url, None)
        if abort is not None:
            raise abort
        usage = self.native_usage(obj)
        choice = Choice(index=0, text=obj.get("text"), finish_reason=reason_text(meta.get("finish_reason")))
        return Response(text=choice.text, choices=(choice,), id=str_or_none(meta.get("id")), model=req.model,
                        usage=usage, backend=self.name, endpoint="generate", endpoint_url=endpoint_url,
                        timings=build_timings(self.server_timings(obj), usage, clock), request_id=req.request_id,
                        extras=self.response_extras(obj))

    def stream_decoder(self, req: Request, endpoint_url: str | None = None) -> ChunkStream:
        if req.endpoint == "generate":
            return GenerateStream(self, req, endpoint_url)
        return ChunkStream(self, req, endpoint_url)


def abort_error(finish_reason: object, obj: Mapping[str, object], endpoint_url: str | None,
                partial_text: str | None) -> ServerError | None:
    """A `finish_reason` of type `abort` is the scheduler ending the request: a typed error (the
    status code and message are the scheduler's own; 503 "The request queue is full." is admission)."""
    if not isinstance(finish_reason, dict) or finish_reason.get("type") != "abort":
        return None
    err = {"message": finish_reason.get("message") or "request aborted by the server",
           "code": finish_reason.get("status_code"), "type": "abort"}
    return stream_error({"error": err}, endpoint_url, partial_text, raw=json.dumps(obj))


class GenerateStream(ChunkStream):
    """`/generate` stream. By default each chunk holds the whole text so far (the delta is the new
    suffix); with `--incremental-streaming-output` chunks are disjoint. The chunk says which:
    `output_ids` holds every token so far when cumulative, fewer than `meta_info.completion_tokens`
    when incremental. Without those counts a chunk that does not extend the text so far is incremental.
    An abort finish reason (the full queue among them) is a typed error, never an empty answer."""

    def __init__(self, dialect: SglangDialect, req: Request, endpoint_url: str | None) -> None:
        super().__init__(dialect, req, endpoint_url)
        self.text = ""
        self.last_obj: SglangGenerateJson | None = None
        self.incremental = False

    payload_key: ClassVar[str] = "text"

    @property
    def partial_text(self) -> str:
        return self.text

    def chunk(self, payload: Mapping[str, object]) -> list[StreamDelta]:
        obj = cast(SglangGenerateJson, payload)
        meta = obj.get("meta_info") or {}
        abort = abort_error(meta.get("finish_reason"), obj, self.endpoint_url, self.text)
        if abort is not None:
            raise abort
        chunk_text = obj.get("text")
        chunk_text = chunk_text if isinstance(chunk_text, str) else ""
        ids, done = obj.get("output_ids"), int_or_none(meta.get("completion_tokens"))
        if isinstance(ids, list) and done is not None:
            self.incremental = len(ids) < done
        elif not chunk_text.startswith(self.text):  # no counts: cumulative text always extends
            self.incremental = True
        if self.incremental:
            delta, self.text = chunk_text, self.text + chunk_text
        else:
            delta, self.text = chunk_text[len(self.text):], chunk_text
        self.last_obj = obj
        fr = reason_text(meta.get("finish_reason"))
        if delta or fr is not None:
            return [StreamDelta(delta=delta, finish_reason=fr, index=0)]
        return []

    def response(self, clock: ClientClock | None = None) -> Response:
        d = self.dialect
        assert isinstance(d, SglangDialect)
        obj = self.last_obj or {}
        meta = obj.get("meta_info") or {}
        usage = d.native_usage(obj)
        choice = Choice(index=0, text=self.text, finish_reason=reason_text(meta.get("finish_reason")))
        return Response(text=self.text, choices=(choice,), id=str_or_none(meta.get("id")), model=self.req.model,
                        usage=usage, backend=d.name, endpoint="generate", endpoint_url=self.endpoint_url,
                        timings=build_timings(d.server_timings(obj), usage, clock), request_id=self.req.request_id,
                        extras=d.response_extras(obj))


DIALECT = SglangDialect()
