"""kotoba-vllm: an EDN-native client for vLLM, SGLang and llama.cpp inference servers.

Everything a client needs is re-exported here. Public subpackages, each listing its names in
`__all__`: `kotoba_vllm.capacity` (capacity probes and verdicts), `kotoba_vllm.batch` (batch
runs), `kotoba_vllm.bench` (benchmarks), `kotoba_vllm.distributed` (distributed specs and
plans), `kotoba_vllm.local` (local llama.cpp servers), `kotoba_vllm.ray` (Ray, with the ray
extra), `kotoba_vllm.pool` and `kotoba_vllm.cassettes`. A leading underscore means private.
docs/architecture.md shows which module owns each step.
"""

from ._client import AsyncClient, AsyncStream, Client, Stream
from ._edn import Edn, EdnMap, Keyword, dumps, kw, pretty, read_file, read_forms
from ._errors import (AdmissionRejected, BadNumber, BadRequest, CassetteError, ConfigError, EdnError,
                      EdnWriteError, InternalError, KotobaError, LocalServerError, NotReady, PromptError, ProtocolError,
                      Redirected, RequestTimeout, ResponseTooLarge, ServerError, ServerFailure, StreamBroken,
                      StructureError, TransportError, Unparsable, Unreachable, ValidationError)
from ._model import (ChatRequest, Choice, CompletionRequest, ContentPart, DetokenizeRequest, DetokenizeResponse,
                     EmbeddingRequest, EmbeddingResponse, Figure, GenerateRequest, Health, Message, ModelInfo,
                     ModelsResponse, Response, Sampling, StreamDelta, Timings, TokenizeRequest, TokenizeResponse,
                     ToolCall, Usage, from_edn, to_edn)
from ._media import inline_local_media
from ._problems import Problem
from ._requests import request_from_edn, request_to_edn
from ._validate import validate
from .dialects import HttpRequest, get_dialect
from .pool import AsyncPool, Pool

__version__ = "0.1.0"

__all__ = [
    "AdmissionRejected", "AsyncClient", "BadNumber", "AsyncStream", "BadRequest", "ChatRequest", "Choice", "Client",
    "CompletionRequest", "ContentPart", "DetokenizeRequest", "DetokenizeResponse", "EdnError", "EmbeddingRequest",
    "EmbeddingResponse", "Figure", "GenerateRequest", "Health", "HttpRequest", "InternalError", "Keyword",
    "KotobaError", "Message",
    "ModelInfo", "ModelsResponse", "NotReady", "Problem", "ProtocolError", "RequestTimeout", "Response", "Sampling",
    "ServerError", "ServerFailure", "Stream", "StreamBroken", "StreamDelta", "Timings", "TokenizeRequest",
    "TokenizeResponse", "ToolCall", "TransportError", "Unreachable", "Usage", "ValidationError", "__version__",
    "dumps", "from_edn", "get_dialect", "kw", "pretty", "read_file", "read_forms", "request_from_edn",
    "request_to_edn", "to_edn", "validate",
    "Pool", "AsyncPool",
    "CassetteError", "ConfigError", "Edn", "EdnMap", "EdnWriteError", "LocalServerError", "PromptError",
    "StructureError", "Unparsable", "Redirected", "ResponseTooLarge", "inline_local_media",
]
