"""I/O shells: ask every endpoint's configuration paths at once and hand the bytes to `read_config`.
Sync (threads) and async (gather) differ only at the call sites; detection and fetching are
capacity's own (`detect_all`, `fetch_all`), over an httpx client or a client's wire."""

from __future__ import annotations

from typing import Mapping, Sequence

import httpx

from .._wire import AsyncWire, SyncWire
from ..capacity._parse import Fetched
from ..capacity._probe import (adetect_all, afetch_all, detect_all, fetch_all, normalise_endpoints, now_iso)
from ._model import ServerConfig
from ._read import config_paths, read_config, unmeasured_config

# Generous next to a capacity probe (SGLang's /server_info is a 20 kB answer), still a bound.
CONFIG_TIMEOUT = httpx.Timeout(5.0, connect=1.0)

Job = tuple[str, str]


def _jobs(eps: Sequence[str], known: Sequence[str | None]) -> list[Job]:
    return [(e, p) for e, b in zip(eps, known) if b is not None for p in config_paths(b)]


def _configs(eps: Sequence[str], known: Sequence[str | None], reasons: Sequence[str | None],
             got: Mapping[Job, Fetched], at: str) -> list[ServerConfig]:
    out = []
    for e, b, why in zip(eps, known, reasons):
        if b is None:
            out.append(unmeasured_config(e, None, why or "backend unknown", at=at, reachable=False))
        else:
            out.append(read_config(e, b, {p: got[(e, p)] for p in config_paths(b)}, at))
    return out


def server_configs(endpoints: Sequence[str], backend: str | Sequence[str] = "auto", *,
                   http: httpx.Client | SyncWire | None = None, headers: Mapping[str, str] | None = None,
                   timeout: httpx.Timeout = CONFIG_TIMEOUT,
                   detected: dict[str, str] | None = None) -> list[ServerConfig]:
    """What each endpoint says it runs, in endpoint order; never raises for a server that fails."""
    eps, bs = normalise_endpoints(endpoints, backend)
    own = http is None
    client = http or httpx.Client(timeout=timeout)
    try:
        at = now_iso()
        known, reasons = detect_all(client, eps, bs, headers=headers, timeout=timeout, detected=detected)
        got = fetch_all(client, _jobs(eps, known), headers=headers, timeout=timeout)
        return _configs(eps, known, reasons, got, at)
    finally:
        if own:
            client.close()


async def aserver_configs(endpoints: Sequence[str], backend: str | Sequence[str] = "auto", *,
                          http: httpx.AsyncClient | AsyncWire | None = None, headers: Mapping[str, str] | None = None,
                          timeout: httpx.Timeout = CONFIG_TIMEOUT,
                          detected: dict[str, str] | None = None) -> list[ServerConfig]:
    eps, bs = normalise_endpoints(endpoints, backend)
    own = http is None
    client = http or httpx.AsyncClient(timeout=timeout)
    try:
        at = now_iso()
        known, reasons = await adetect_all(client, eps, bs, headers=headers, timeout=timeout, detected=detected)
        got = await afetch_all(client, _jobs(eps, known), headers=headers, timeout=timeout)
        return _configs(eps, known, reasons, got, at)
    finally:
        if own:
            await client.aclose()
