"""Which servers may see the API key: origins (scheme, host, port), as browsers and httpx's
cross-origin redirects judge them.

The key goes only to origins the user configured - the client's base URL, pool members,
and origins trusted explicitly (`trusted_origins=`, `run --trust-origin`). A request that
names another server (`:vllm/base-url`, a batch line's absolute `url`) is still sent, but
without the key.
"""

from __future__ import annotations

from typing import Iterable, Iterator
from urllib.parse import urlsplit

from ._errors import ConfigError
from ._memo import BoundedMemo

Origin = tuple[str, str, int]
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> Origin | None:
    """(scheme, host, port) with the scheme and host lower-cased and the default port filled in;
    None when `url` names no server."""
    try:
        parts = urlsplit(url.strip())
        scheme, host, port = parts.scheme.lower(), (parts.hostname or "").lower(), parts.port
    except ValueError:  # a port that is not a number, a bad IPv6 literal ...
        return None
    if not scheme or not host:
        return None
    if port is None:
        port = _DEFAULT_PORTS.get(scheme)
        if port is None:
            return None
    return scheme, host, port


def show(o: Origin) -> str:
    scheme, host, port = o
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}" + ("" if _DEFAULT_PORTS.get(scheme) == port else f":{port}")


class TrustedOrigins:
    """The origins the key may go to. Membership is by origin, never by URL prefix."""

    __slots__ = ("_origins", "_cache")

    def __init__(self, urls: Iterable[str] = ()) -> None:
        self._origins: set[Origin] = set()
        self._cache: BoundedMemo[str, bool] = BoundedMemo(256)
        for u in urls:
            self.add(u)

    def add(self, url: str) -> None:
        o = origin_of(url)
        if o is None:
            raise ConfigError(f"not a server URL (scheme://host[:port]): {url!r}")
        self._origins.add(o)
        self._cache.clear()

    def allows(self, url: str) -> bool:
        hit = self._cache.get(url)
        return hit if hit is not None else self._cache.keep(url, origin_of(url) in self._origins)

    def __iter__(self) -> Iterator[Origin]:
        return iter(sorted(self._origins))

    def describe(self) -> str:
        return ", ".join(show(o) for o in sorted(self._origins)) or "none"
