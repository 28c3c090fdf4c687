"""Local media into a request: a content part's `:vllm/path` becomes a data URL (or inline base64 data),
read only from under the directories the caller trusts (a request file's own directory, `--media-root`),
each file size-checked before it is read. I/O at the edge: the dialects stay pure."""

from __future__ import annotations

import base64
import mimetypes
import os
from typing import Iterable

import attrs

from ._model import ChatRequest, ContentPart, Message, Request
from ._problems import Problem

MAX_MEDIA_BYTES = 20 * 1024 * 1024  # per file, before base64 (which adds a third)
AUDIO_FORMATS = {".wav": "wav", ".mp3": "mp3", ".flac": "flac", ".ogg": "ogg", ".m4a": "m4a"}


def _problem(msg: str, where: str | None) -> Problem:
    return Problem("error", "message/media", msg, field="vllm/path", where=where)


def _under(path: str, roots: Iterable[str]) -> bool:
    real = os.path.realpath(path)
    return any(os.path.commonpath([real, os.path.realpath(r)]) == os.path.realpath(r) for r in roots)


def _inline(p: ContentPart, roots: tuple[str, ...], max_bytes: int, where: str | None,
            out: list[Problem]) -> ContentPart:
    assert p.path is not None
    path = p.path if os.path.isabs(p.path) or not roots else os.path.join(roots[0], p.path)
    if not _under(path, roots):
        out.append(_problem(f":vllm/path {p.path!r} is outside the directories media may come from "
                            f"({', '.join(roots) or 'none given'}); pass it with --media-root to allow it", where))
        return p
    try:
        size = os.path.getsize(path)
    except OSError as e:
        out.append(_problem(f":vllm/path {p.path!r}: {e.strerror or e}", where))
        return p
    if size > max_bytes:
        out.append(_problem(f":vllm/path {p.path!r} is {size} bytes, over the {max_bytes}-byte limit", where))
        return p
    with open(path, "rb") as fh:
        data = base64.b64encode(fh.read(max_bytes + 1)).decode("ascii")
    ext = os.path.splitext(path)[1].lower()
    if p.type == "input-audio":
        return attrs.evolve(p, path=None, data=data, format=p.format or AUDIO_FORMATS.get(ext, ext.lstrip(".")))
    if p.type == "image-embeds":
        return attrs.evolve(p, path=None, data=data)
    mime = mimetypes.guess_type(path)[0] or "application/octet-stream"
    return attrs.evolve(p, path=None, url=f"data:{mime};base64,{data}")


def has_local_media(req: Request) -> bool:
    return isinstance(req, ChatRequest) and any(
        not isinstance(m.content, str) and m.content is not None and any(p.path is not None for p in m.content)
        for m in req.messages)


def inline_local_media(req: Request, roots: Iterable[str], max_bytes: int = MAX_MEDIA_BYTES,
                       where: str | None = None) -> tuple[Request, list[Problem]]:
    """`req` with every `:vllm/path` part read into the request, and the problems (a path outside `roots`,
    missing, or too large: that part is left as it was, and the request is not sent)."""
    if not has_local_media(req):
        return req, []
    assert isinstance(req, ChatRequest)
    trusted = tuple(str(r) for r in roots)
    out: list[Problem] = []
    messages: list[Message] = []
    for m in req.messages:
        if isinstance(m.content, str) or m.content is None or all(p.path is None for p in m.content):
            messages.append(m)
            continue
        parts = tuple(_inline(p, trusted, max_bytes, where, out) if p.path is not None else p for p in m.content)
        messages.append(attrs.evolve(m, content=parts))
    return attrs.evolve(req, messages=tuple(messages)), out
