"""Any OpenAI-compatible server; the base every engine dialect refines.

Tables as data: which sampling knobs each route honours and under which wire name.
A knob an engine would ignore is a validation error naming knob and engine.
"""

from __future__ import annotations

import json
from typing import Any, Callable, ClassVar, Mapping, TypedDict, cast

import attrs

from .._fields import (EXTRA_BODY, engine_problems, extra_headers, fields_on, merge_extra_body, part_problems,
                       render_fields)
from .._codec import edn_to_json, json_to_edn
from .._edn import Edn
from .._errors import ProtocolError, ValidationError
from .._memo import IdentityMemo
from .._model import (AnyResponse, Choice, ChatRequest, CompletionRequest, DetokenizeRequest, DetokenizeResponse,
                      EmbeddingRequest, EmbeddingResponse, Message, ModelInfo, ModelsResponse, Request, Response,
                      Sampling, StreamDelta, TokenizeRequest, TokenizeResponse, ToolCall, Usage, stream_delta)
from .._problems import Problem
from .._sampling import KNOBS_BY_ATTR, STRUCTURED_ATTRS
from .._timings import ClientClock, ServerTimings, build_timings
from ._endpoints import CONTROL_ENDPOINTS, ENDPOINTS_HERE, decode_base64_floats, endpoint_refusal, option_problems
from ._endpoints import parse_endpoint, render_endpoint
from ._http import ORJSON, ORJSON_LOADS, HttpRequest, error_object, loads_as_json, stream_error
from ._shapes import ChunkJson

OPENAI_SAMPLING = frozenset({"temperature", "top_p", "max_tokens", "n", "presence_penalty", "frequency_penalty",
                             "stop", "seed", "logprobs", "guided_json"})


class Dialect:
    """The OpenAI-compatible protocol. Subclasses change tables, and override a method only where the
    engine's protocol really differs."""

    name: ClassVar[str] = "openai"
    routes: ClassVar[dict[str, str]] = {
        "chat": "/v1/chat/completions",
        "completion": "/v1/completions",
        "embedding": "/v1/embeddings",
    }
    models_path: ClassVar[str] = "/v1/models"
    health_path: ClassVar[str] = "/v1/models"
    # endpoint -> sampling attrs this engine honours there
    sampling_support: ClassVar[dict[str, frozenset[str]]] = {
        "chat": OPENAI_SAMPLING, "completion": OPENAI_SAMPLING - {"guided_json"}}
    # sampling attr -> wire name, where this engine's name differs from the OpenAI one
    wire_names: ClassVar[dict[str, dict[str, str]]] = {}
    streams_usage: ClassVar[bool] = True  # send stream_options.include_usage
    # where the request id goes: a body field (vLLM `request_id`, SGLang `rid`) and/or the X-Request-Id header
    request_id_field: ClassVar[str | None] = None
    request_id_header: ClassVar[bool] = True
    # the endpoints whose request model has that body field (the others get the header alone)
    request_id_endpoints: ClassVar[frozenset[str]] = frozenset({"chat", "completion", "embedding"})
    # content part types this engine's chat route takes (OpenAI: text, images, inline audio)
    part_types: ClassVar[frozenset[str]] = frozenset({"text", "image-url", "input-audio"})
    # options of the pooling endpoints this engine applies (`_endpoints.OPTIONS`; OpenAI's embeddings have both)
    endpoint_options: ClassVar[frozenset[str]] = frozenset({"dimensions", "encoding_format", "top_n"})
    # endpoints whose 2xx answer may be text, or nothing, rather than JSON
    text_answers: ClassVar[frozenset[str]] = CONTROL_ENDPOINTS

    # ------------------------------------------------------------ validation

    def problems(self, req: Request) -> list[Problem]:
        out: list[Problem] = []
        ep = req.endpoint
        if ep not in self.routes:
            out.append(endpoint_refusal(self.name, ep))
            return out
        if ep in ENDPOINTS_HERE or ep == "embedding":
            out.extend(option_problems(self.name, req, self.endpoint_options))
        sampling: Sampling | None = getattr(req, "sampling", None)
        supported = self.sampling_support.get(ep, frozenset())
        honoured = _SUPPORTED.get(id(sampling)) if sampling is not None else None
        if sampling is not None and (honoured is None or (self, ep) not in honoured):
            before = len(out)
            for attr, knob in KNOBS_BY_ATTR.items():
                if getattr(sampling, attr) is not None and attr not in supported:
                    out.append(Problem("error", "engine/unsupported", f"{self.name} does not honour :{knob.key} on "
                                       f"the {ep} route; it would be ignored or rejected",
                                       field=knob.key, engine=self.name))
            if len(out) == before:  # which knobs are set cannot change (frozen): remember the clean ones
                (honoured if honoured is not None else _SUPPORTED.keep(sampling, set())).add((self, ep))
        if isinstance(req, ChatRequest) and any(type(m.content) is tuple for m in req.messages):
            out.extend(part_problems(req, self.name, self.part_types))
        if req.extras:
            out.extend(engine_problems(self.name, ep, req.extras))
            if EXTRA_BODY in req.extras and not any(p.is_error for p in out):
                out.extend(Problem("error", "request/pass-through", f":{EXTRA_BODY} {k!r} would replace the "
                                   f"{k!r} the SDK renders for {self.name}; set it with its own key instead",
                                   field=EXTRA_BODY, engine=self.name)
                           for k in self._clashes(req))
        return out

    def _clashes(self, req: Request) -> list[str]:
        body = self.render_core(req)
        if not isinstance(body.body, dict):  # none, or a JSON array (`render` refuses a pass-through there)
            return []
        return merge_extra_body(req.extras, dict(body.body), *self.sampling_params_of(body))

    # ------------------------------------------------------------ rendering

    def render(self, req: Request) -> HttpRequest:
        """The request on this engine's wire: the route, the JSON body with every field rendered, the
        pass-through merged (never over a rendered key) and the request's own headers."""
        http = self.render_core(req)
        if req.request_id is not None or req.extras:
            headers = extra_headers(req.extras) if req.extras else {}
            if req.request_id is not None and self.request_id_header:
                headers["x-request-id"] = str(req.request_id)
            if EXTRA_BODY in req.extras and http.body is not None:
                if not isinstance(http.body, dict):
                    raise ValidationError([Problem("error", "request/pass-through", f":{EXTRA_BODY} has no JSON "
                                                   "object to go into: this request's body is an array",
                                                   field=EXTRA_BODY, engine=self.name)])
                clashes = merge_extra_body(req.extras, http.body, *self.sampling_params_of(http))
                if clashes:
                    raise ValidationError([Problem("error", "request/pass-through", f":{EXTRA_BODY} {k!r} "
                                                   f"would replace the {k!r} the SDK renders", field=EXTRA_BODY,
                                                   engine=self.name) for k in clashes])
            if headers:
                http = attrs.evolve(http, headers=headers)
        return http

    def sampling_params_of(self, http: HttpRequest) -> tuple[dict[str, object] | None, frozenset[str]]:
        """Where pass-through sampling keys go on this route (SGLang `/generate`: `sampling_params`), and their names."""
        return None, frozenset()

    def render_core(self, req: Request) -> HttpRequest:
        ep = req.endpoint
        path = self.routes[ep]
        if ep in ENDPOINTS_HERE:
            return render_endpoint(req, self.routes, {k: (o.wire, o.routes) for k, (_, o) in
                                                      fields_on(self.name).items()}, self._request_id_field(ep))
        body: dict[str, object] = {}
        if req.model is not None:
            body["model"] = req.model
        if isinstance(req, ChatRequest):
            body["messages"] = [self.render_message(m) for m in req.messages]
            if req.tools is not None:
                body["tools"] = edn_to_json(req.tools)
            if req.tool_choice is not None:
                body["tool_choice"] = edn_to_json(req.tool_choice)
        elif isinstance(req, CompletionRequest):
            body["prompt"] = req.prompt if isinstance(req.prompt, str) else list(req.prompt)
        elif isinstance(req, EmbeddingRequest):
            body["input"] = req.input if isinstance(req.input, str) else list(req.input)
            if req.dimensions is not None:
                body["dimensions"] = req.dimensions
            if req.encoding_format is not None:
                body["encoding_format"] = req.encoding_format
        elif isinstance(req, TokenizeRequest):
            return self.render_tokenize(req)
        elif isinstance(req, DetokenizeRequest):
            return self.render_detokenize(req)
        else:
            return self.render_generate(req)
        stream = bool(req.stream)
        if req.sampling is not None:
            body.update(self.sampling_body(req.sampling, ep))
        if stream:
            body["stream"] = True
            if self.streams_usage:
                body["stream_options"] = {"include_usage": True}
        if req.request_id is not None:
            id_field = self._request_id_field(ep)
            if id_field is not None:
                body[id_field] = str(req.request_id)
        if req.extras:
            render_fields(self.name, ep, req.extras, body)
        return HttpRequest("POST", path, body, stream)

    def _request_id_field(self, ep: str) -> str | None:
        return self.request_id_field if ep in self.request_id_endpoints else None

    def render_message(self, m: Message) -> dict[str, object]:
        out: dict[str, object] = {"role": m.role}
        if m.content is None:
            out["content"] = None
        elif isinstance(m.content, str):
            out["content"] = m.content
        else:
            parts: list[dict[str, object]] = []
            for p in m.content:
                if p.type == "text":
                    parts.append({"type": "text", "text": p.text or ""})
                    continue
                wire = p.type.replace("-", "_")
                if p.type == "image-embeds":
                    parts.append({"type": wire, wire: p.data})
                    continue
                inner: dict[str, object] = {}
                for name in ("url", "data", "format", "detail"):
                    v = getattr(p, name)
                    if v is not None:
                        inner[name] = v
                parts.append({"type": wire, wire: inner})
            out["content"] = parts
        if m.name is not None:
            out["name"] = m.name
        if m.tool_call_id is not None:
            out["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            out["tool_calls"] = [{"id": t.id, "type": t.type or "function",
                                  "function": {"name": t.name, "arguments": t.arguments or "{}"}}
                                 for t in m.tool_calls]
        if m.reasoning is not None:
            out["reasoning_content"] = m.reasoning
        return out

    def sampling_body(self, s: Sampling, ep: str) -> dict[str, object]:
        """`render_sampling` on its own, rendered once per Sampling of plain values (a batch, or keyword
        arguments, repeat the same few; the result holds only immutable values, so it is shared safely)."""
        bodies = _SAMPLING_BODIES.get(id(s))
        hit = bodies.get((self, ep)) if bodies is not None else None
        if hit is not None:
            return hit
        out: dict[str, object] = {}
        self.render_sampling(s, ep, out)
        # structured outputs may be built from a caller's mutable map: rendered afresh every time
        if all(type(v) in _PLAIN for v in out.values()) and all(getattr(s, a) is None for a in STRUCTURED_ATTRS):
            (bodies if bodies is not None else _SAMPLING_BODIES.keep(s, {}))[(self, ep)] = out
        return out

    def render_sampling(self, s: Sampling, ep: str, body: dict[str, object]) -> None:
        renames = self.wire_names.get(ep, {})
        for attr, knob in KNOBS_BY_ATTR.items():
            v = getattr(s, attr)
            if v is None or attr in STRUCTURED_ATTRS:
                continue
            if attr == "logprobs":
                self.render_logprobs(v, ep, body)
                continue
            body[renames.get(attr, knob.wire)] = list(v) if isinstance(v, tuple) else v
        if any(getattr(s, a) is not None for a in STRUCTURED_ATTRS):
            self.render_structured(s, ep, body)

    def render_logprobs(self, v: int | bool, ep: str, body: dict[str, object]) -> None:
        if ep == "chat":
            body["logprobs"] = bool(v)
            if v is not True and v is not False and v > 0:
                body["top_logprobs"] = v
        else:
            body["logprobs"] = int(v)

    def render_structured(self, s: Sampling, ep: str, body: dict[str, object]) -> None:
        # OpenAI's own form: response_format json_schema.
        if s.guided_json is not None:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "output", "schema": schema_json(s.guided_json)}}

    def render_tokenize(self, req: TokenizeRequest) -> HttpRequest:
        # vLLM's and SGLang's shape; reached only when `routes` has a tokenize route
        body: dict[str, object] = {"prompt": req.text}
        if req.model is not None:
            body["model"] = req.model
        if req.add_special is not None:
            body["add_special_tokens"] = req.add_special
        return HttpRequest("POST", self.routes["tokenize"], body)

    def render_detokenize(self, req: DetokenizeRequest) -> HttpRequest:
        body: dict[str, object] = {"tokens": list(req.tokens)}
        if req.model is not None:
            body["model"] = req.model
        return HttpRequest("POST", self.routes["detokenize"], body)

    def render_generate(self, req: Request) -> HttpRequest:
        raise NotImplementedError  # pragma: no cover

    # ------------------------------------------------------------ parsing

    def parse(self, req: Request, obj: object, endpoint_url: str | None = None,
              clock: ClientClock | None = None) -> AnyResponse:
        """A complete (non-streamed) JSON answer -> typed response."""
        if req.endpoint in ENDPOINTS_HERE:  # some of these answer a list, or text
            return parse_endpoint(obj, self.name, req, endpoint_url)
        if not isinstance(obj, dict):
            raise ProtocolError(f"expected a JSON object from {self.name}", offending=json.dumps(obj)[:500],
                                endpoint=endpoint_url)
        ep = req.endpoint
        if ep == "embedding":
            return self.parse_embedding(obj, endpoint_url, req)
        if ep == "tokenize":
            return TokenizeResponse(tokens=tuple(self.tokens_of(obj)), backend=self.name, endpoint_url=endpoint_url,
                                    request_id=req.request_id)
        if ep == "detokenize":
            return DetokenizeResponse(text=self.detokenized_text(obj), backend=self.name, endpoint_url=endpoint_url,
                                      request_id=req.request_id)
        if ep == "generate":
            return self.parse_generate(req, obj, endpoint_url, clock)
        if "choices" not in obj or not isinstance(obj["choices"], list):
            raise ProtocolError(f"{self.name} answer has no choices", offending=json.dumps(obj)[:500],
                                endpoint=endpoint_url)
        choices = tuple(self.parse_choice(c) for c in obj["choices"])
        usage = self.parse_usage(obj.get("usage"))
        server = self.server_timings(obj)
        return Response(text=choices[0].text if choices else None, choices=choices, id=obj.get("id"),
                        model=obj.get("model"), usage=usage, backend=self.name, endpoint=ep,
                        endpoint_url=endpoint_url, timings=build_timings(server, usage, clock),
                        request_id=req.request_id, created=int_or_none(obj.get("created")),
                        system_fingerprint=str_or_none(obj.get("system_fingerprint")), extras=self.response_extras(obj))

    def parse_choice(self, c: Mapping[str, object]) -> Choice:
        msg = c.get("message")
        if isinstance(msg, dict):
            text = msg.get("content")
            reasoning = msg.get("reasoning_content") or msg.get("reasoning")
            tool_calls = self.parse_tool_calls(msg.get("tool_calls"))
            if text is None and isinstance(reasoning, str):
                text = ""  # all reasoning, no answer: empty text (as a stream assembles it), never None
        else:
            text, reasoning, tool_calls = c.get("text"), None, None
        lp = c.get("logprobs")
        return Choice(index=int_or_none(c.get("index")) or 0, text=text if isinstance(text, str) else None,
                      finish_reason=reason_text(c.get("finish_reason")), tool_calls=tool_calls,
                      reasoning=reasoning if isinstance(reasoning, str) else None,
                      logprobs=json_to_edn(lp) if lp is not None else None)

    def parse_tool_calls(self, raw: object) -> tuple[ToolCall, ...] | None:
        if not isinstance(raw, list) or not raw:
            return None
        out = []
        for t in raw:
            fn = t.get("function") or {}
            args = fn.get("arguments")
            out.append(ToolCall(name=str(fn.get("name") or ""),
                                arguments=args if isinstance(args, str) else json.dumps(args),
                                id=str_or_none(t.get("id")), type=str_or_none(t.get("type")) or "function",
                                index=int_or_none(t.get("index"))))
        return tuple(out)

    def parse_usage(self, u: object) -> Usage | None:
        if not isinstance(u, dict):
            return None
        details = u.get("prompt_tokens_details") or _NONE
        cdetails = u.get("completion_tokens_details") or _NONE
        return Usage(prompt_tokens=int_or_none(u.get("prompt_tokens")),
                     completion_tokens=int_or_none(u.get("completion_tokens")),
                     total_tokens=int_or_none(u.get("total_tokens")),
                     cached_tokens=int_or_none(details.get("cached_tokens")) if isinstance(details, dict) else None,
                     # OpenAI/vLLM nest it in completion_tokens_details; SGLang reports it at the top level
                     reasoning_tokens=(int_or_none(cdetails.get("reasoning_tokens")) if isinstance(cdetails, dict)
                                       else None) if cdetails else int_or_none(u.get("reasoning_tokens")))

    def server_timings(self, obj: Mapping[str, object]) -> ServerTimings | None:
        return None

    def response_extras(self, obj: Mapping[str, object]) -> dict[str, Edn]:
        return {}

    def parse_embedding(self, obj: Mapping[str, object], endpoint_url: str | None, req: Request) -> EmbeddingResponse:
        data = obj.get("data")
        if not isinstance(data, list):
            raise ProtocolError("embedding answer has no data list", offending=json.dumps(obj)[:500],
                                endpoint=endpoint_url)
        vecs = tuple(tuple(decode_base64_floats(v, obj, endpoint_url) if isinstance(v, str) else (float(x) for x in v))
                     for v in (d.get("embedding", ()) for d in sorted(data, key=lambda d: d.get("index", 0))))
        return EmbeddingResponse(embeddings=vecs, model=str_or_none(obj.get("model")),
                                 usage=self.parse_usage(obj.get("usage")), backend=self.name,
                                 endpoint_url=endpoint_url, request_id=req.request_id,
                                 id=str_or_none(obj.get("id")))

    def tokens_of(self, obj: Mapping[str, object]) -> list[int]:
        toks = obj.get("tokens")
        if not isinstance(toks, list):
            raise ProtocolError("tokenize answer has no tokens", offending=json.dumps(obj)[:500])
        # llama.cpp may answer [{"id": 1, "piece": "a"}] when pieces are asked for
        return [t["id"] if isinstance(t, dict) else int(t) for t in toks]

    def detokenized_text(self, obj: Mapping[str, object]) -> str:
        for k in ("prompt", "content", "text"):
            text = obj.get(k)
            if isinstance(text, str):
                return text
        raise ProtocolError("detokenize answer has no text", offending=json.dumps(obj)[:500])

    def parse_generate(self, req: Request, obj: Mapping[str, object], endpoint_url: str | None,
                       clock: ClientClock | None) -> Response:
        raise NotImplementedError  # pragma: no cover

    def parse_models(self, obj: object, endpoint_url: str | None = None) -> ModelsResponse:
        data = obj.get("data") if isinstance(obj, dict) else None
        if not isinstance(data, list):
            raise ProtocolError("models answer has no data list", offending=json.dumps(obj)[:500],
                                endpoint=endpoint_url)
        return ModelsResponse(models=tuple(ModelInfo(id=str(m.get("id")), owned_by=str_or_none(m.get("owned_by")),
                                                     max_model_len=int_or_none(m.get("max_model_len")))
                                           for m in data if isinstance(m, dict)),
                              backend=self.name, endpoint_url=endpoint_url)

    # ------------------------------------------------------------ streaming

    def stream_decoder(self, req: Request, endpoint_url: str | None = None) -> "ChunkStream":
        return ChunkStream(self, req, endpoint_url)


class ToolSlot(TypedDict):
    """One tool call of a streamed choice, joined from its deltas (the server's values, as it sent them)."""

    id: str | None
    name: str
    arguments: str
    type: str | None


class ChunkStream:
    """Pure assembler for OpenAI-style `chat.completion.chunk` / `text_completion` streams.

    `feed(data)` takes one SSE `data:` payload and returns the deltas it carries; an error
    object raises a typed error carrying the text so far. `response(clock)` builds the final answer.
    """

    def __init__(self, dialect: Dialect, req: Request, endpoint_url: str | None) -> None:
        self.dialect, self.req, self.endpoint_url = dialect, req, endpoint_url
        self.texts: dict[int, list[str]] = {}
        self.reasoning: dict[int, list[str]] = {}
        self.finish: dict[int, str | None] = {}
        self.tools: dict[int, dict[int, ToolSlot]] = {}
        self.logprobs: dict[int, dict[str, object]] = {}
        self.usage: Usage | None = None
        self.server: ServerTimings | None = None
        self.id: str | None = None
        self.model: str | None = None
        self.created: int | None = None
        self.fingerprint: str | None = None
        self.extras: dict[str, Edn] = {}
        self.done = False
        self._engine_timings = type(dialect).server_timings is not Dialect.server_timings
        self._engine_extras = type(dialect).response_extras is not Dialect.response_extras

    # A chunk carrying this key is data even when it also looks like an error object.
    payload_key: ClassVar[str] = "choices"

    @property
    def partial_text(self) -> str:
        return "".join(self.texts.get(0, ()))

    def feed(self, data: str, wide_ints: bool = True) -> list[StreamDelta]:
        """One event's data. `wide_ints=False`: the bytes it came in hold no 19-digit run (SseDecoder checks each
        read once), so orjson reads it exactly as json does without a check of its own."""
        if data.strip() == "[DONE]":
            self.done = True
            return []
        try:
            if wide_ints or ORJSON_LOADS is None:
                obj = json_chunk(data)
            else:  # `loads_narrow`, inlined: one call less per chunk
                try:
                    obj = ORJSON_LOADS(data)
                except ValueError:  # what orjson refuses json may still read (NaN, lone surrogates)
                    obj = json.loads(data)
        except ValueError:
            raise ProtocolError("malformed JSON in stream", offending=data, endpoint=self.endpoint_url,
                                partial_text=self.partial_text) from None
        payload: ChunkJson = obj  # read as the chunk shape once it is known to be a JSON object, just below
        if not isinstance(obj, dict):
            raise ProtocolError("stream chunk is not a JSON object", offending=data, endpoint=self.endpoint_url,
                                partial_text=self.partial_text)
        if self.payload_key not in obj and error_object(obj) is not None:
            raise stream_error(obj, self.endpoint_url, self.partial_text)
        return self.chunk(payload)

    def chunk(self, obj: ChunkJson) -> list[StreamDelta]:
        d = self.dialect
        # Per-chunk hot path: header fields are read until first seen, engine hooks only when overridden.
        if not self.id:
            self.id = str_or_none(obj.get("id"))
        if not self.model:
            self.model = str_or_none(obj.get("model"))
        if not self.created:
            self.created = int_or_none(obj.get("created"))
        if not self.fingerprint:
            self.fingerprint = str_or_none(obj.get("system_fingerprint"))
        if obj.get("usage"):
            self.usage = d.parse_usage(obj["usage"])
        if self._engine_timings:
            st = d.server_timings(obj)
            if st is not None:
                self.server = st
        if self._engine_extras:
            self.extras.update(d.response_extras(obj))
        out: list[StreamDelta] = []
        for c in obj.get("choices") or ():
            idx = c.get("index")
            if type(idx) is not int:  # same as `int_or_none(..) or 0` for JSON values, without the calls
                idx = 0
            delta = c.get("delta")
            reasoning = None
            tool_deltas = None
            if isinstance(delta, dict):
                text = delta.get("content")
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if delta.get("tool_calls"):
                    tool_deltas = delta["tool_calls"]
                    self._merge_tools(idx, tool_deltas)
            else:
                text = c.get("text")
            if text.__class__ is not str:
                text = ""
            if text:
                parts = self.texts.get(idx)
                if parts is None:
                    parts = self.texts[idx] = []
                parts.append(text)
            if reasoning and reasoning.__class__ is str:
                self.reasoning.setdefault(idx, []).append(reasoning)
            else:
                reasoning = None
            lp = c.get("logprobs")
            if lp is not None:
                lp = self._merge_logprobs(idx, lp)
            fr = c.get("finish_reason")
            if fr is not None:
                fr = reason_text(fr)
            if fr is not None:
                self.finish[idx] = fr
            elif idx not in self.finish:
                self.finish[idx] = None
            if text or fr is not None or reasoning or tool_deltas or lp:
                out.append(stream_delta(text, fr, idx, reasoning,
                                        json_to_edn(tool_deltas) if tool_deltas else None, lp))
        return out

    def _merge_logprobs(self, idx: int, lp: object) -> Edn:
        """Keep one chunk's logprobs (EDN, for its delta) and join them into the choice's, in the
        non-streamed shape: chat `{"content": [...]}`, completion parallel lists (`tokens`, ...)."""
        if not isinstance(lp, dict):
            return None
        acc = self.logprobs.setdefault(idx, {})
        for k, v in lp.items():
            if isinstance(v, list):
                cast("list[object]", acc.setdefault(k, [])).extend(v)  # a list since its first chunk
            elif k not in acc or acc[k] is None:
                acc[k] = v
        return json_to_edn(lp)

    def _merge_tools(self, idx: int, deltas: list[object]) -> None:
        calls = self.tools.setdefault(idx, {})
        for t in deltas:
            if not isinstance(t, dict):
                continue
            slot = calls.setdefault(int_or_none(t.get("index")) or 0,
                                    {"id": None, "name": "", "arguments": "", "type": None})
            if t.get("id"):
                slot["id"] = t["id"]
            if t.get("type"):
                slot["type"] = t["type"]
            fn = t.get("function") or {}
            if fn.get("name"):
                slot["name"] += fn["name"]
            if fn.get("arguments"):
                slot["arguments"] += fn["arguments"]

    def response(self, clock: ClientClock | None = None) -> Response:
        indices = sorted(set(self.texts) | set(self.finish) | set(self.tools)) or [0]
        choices = []
        for i in indices:
            tools = self.tools.get(i)
            choices.append(Choice(
                index=i, text="".join(self.texts.get(i, ())), finish_reason=self.finish.get(i),
                tool_calls=tuple(ToolCall(name=t["name"], arguments=t["arguments"], id=t["id"],
                                          type=t["type"] or "function", index=k)
                                 for k, t in sorted(tools.items())) if tools else None,
                reasoning="".join(self.reasoning[i]) if i in self.reasoning else None,
                logprobs=json_to_edn(self.logprobs[i]) if i in self.logprobs else None))
        return Response(text=choices[0].text, choices=tuple(choices), id=self.id, model=self.model,
                        usage=self.usage, backend=self.dialect.name, endpoint=self.req.endpoint,
                        endpoint_url=self.endpoint_url, timings=build_timings(self.server, self.usage, clock),
                        request_id=self.req.request_id, created=self.created, system_fingerprint=self.fingerprint,
                        extras=self.extras)


def schema_json(v: Edn) -> object:
    """A guided-json schema given as EDN data or as a JSON string -> JSON value."""
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return edn_to_json(v)


_RAW_DECODE = json.JSONDecoder().raw_decode


def json_chunk(data: str) -> Any:
    """`json.loads` for one stream payload, faster. With orjson installed, `loads_as_json` (json's answer
    and errors, orjson's speed). Without it: `raw_decode` minus `json.loads`' per-call layers on the common
    exact-fit case; surrounding whitespace or trailing garbage falls back to `json.loads`."""
    if ORJSON:
        return loads_as_json(data)
    try:
        obj, end = _RAW_DECODE(data)
    except ValueError:
        return json.loads(data)
    return obj if end == len(data) else json.loads(data)


_NONE: Mapping[str, object] = {}  # read only: an absent details map
# By Sampling (the very object a batch shares), then by (dialect, endpoint): its wire fields, and where it is
# fully honoured.
_SAMPLING_BODIES: IdentityMemo[Sampling, dict[tuple[Dialect, str], dict[str, object]]] = IdentityMemo(1024)
_PLAIN = frozenset({str, int, float, bool, type(None)})
_SUPPORTED: IdentityMemo[Sampling, set[tuple[Dialect, str]]] = IdentityMemo(1024)


def int_or_none(v: object) -> int | None:
    """A count or index from the server: a non-negative int a float can hold, else unknown."""
    if type(v) is int:  # what JSON gives: the rest of the test is for int subclasses (bool)
        return v if 0 <= v <= 2**53 else None
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 2**53 else None


def str_or_none(v: object) -> str | None:
    return v if isinstance(v, str) else None


def reason_text(v: object) -> str | None:
    """The finish reason as the server spelled it ("tool_calls"), as the Clojure library keeps it."""
    if isinstance(v, dict):  # SGLang: {"type": "length", ...}
        v = v.get("type")
    return v if isinstance(v, str) and v else None


DIALECT = Dialect()
