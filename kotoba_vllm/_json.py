"""JSON as the engines send and take it, typed once for every module: `JsonValue` is any JSON value
(recursive), `JsonObject` one JSON object. A value only passed through (never looked into) is `object`."""

from __future__ import annotations

from typing import Dict, List, TypeAlias, Union

JsonValue: TypeAlias = Union[None, bool, int, float, str, List["JsonValue"], Dict[str, "JsonValue"]]
JsonObject: TypeAlias = Dict[str, JsonValue]
