"""OpenAI-style message dicts -> EDN message maps, every field the model has kept.

Shared by `Client.chat([...dicts])` and batch JSONL bodies, so both keep `tool_calls`,
`tool_call_id` and `name` the same way and name what they cannot keep.
"""

from __future__ import annotations

import json
from typing import Mapping, cast

from ._edn import Edn, Keyword, kw

MESSAGE_FIELDS = {"role": "vllm/role", "content": "vllm/content", "name": "vllm/name",
                  "tool_call_id": "vllm/tool-call-id", "tool_calls": "vllm/tool-calls",
                  "reasoning_content": "vllm/reasoning-content"}


def _tool_call(t: object) -> object:
    if not isinstance(t, dict):
        return t  # the message reader names the type
    fn = t.get("function")
    fn = fn if isinstance(fn, dict) else {}
    args = fn.get("arguments")
    if isinstance(args, (dict, list)):  # the wire form is a JSON string; a parsed value means the same
        args = json.dumps(args, ensure_ascii=False)
    return {kw("vllm/id"): t.get("id"), kw("vllm/type"): kw(t.get("type") or "function"),
            kw("vllm/name"): fn.get("name"), kw("vllm/arguments"): args}


def _part(p: object) -> object:
    if not isinstance(p, dict):
        return p
    t = p.get("type")
    if t == "text":
        return {kw("vllm/type"): kw("text"), kw("vllm/text"): p.get("text")}
    if t == "image_embeds" and isinstance(p.get(t), str):
        return {kw("vllm/type"): kw("image-embeds"), kw("vllm/data"): p[t]}
    if isinstance(t, str) and isinstance(p.get(t), dict):
        inner = p[t]
        out = {kw("vllm/type"): kw(t.replace("_", "-"))}
        for name in ("url", "detail", "data", "format"):
            if inner.get(name) is not None:
                out[kw(f"vllm/{name}")] = inner[name]
        return out
    return {kw("vllm/type"): kw(str(t))}


def message_to_edn(m: Mapping[str, object]) -> tuple[dict[Keyword, Edn], list[str]]:
    """The EDN message map, and the names of fields that have no EDN equivalent (left out)."""
    out: dict[Keyword, object] = {}
    unknown: list[str] = []
    for k, v in m.items():
        key = MESSAGE_FIELDS.get(k)
        if key is None:
            unknown.append(k)
            continue
        if k == "role" and isinstance(v, str):
            v = kw(v)
        elif k == "content" and isinstance(v, list):
            v = [_part(p) for p in v]
        elif k == "tool_calls" and isinstance(v, list):
            v = [_tool_call(t) for t in v]
        out[kw(key)] = v
    return cast("dict[Keyword, Edn]", out), unknown  # the caller's values: the message reader checks each
