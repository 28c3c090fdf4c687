"""The aiohttp wire reaches into aiohttp in two places, and nowhere else (issue 34 item 5):

- `Connector` replaces `TCPConnector._factory` so every connection's protocol is a `CountingHandler`
  (the byte count is the resend rule's evidence; aiohttp has no public hook for received bytes);
- `CountingHandler` keeps aiohttp's per-read timeout lazily, overriding `ResponseHandler`'s
  `_reschedule_timeout` / `_drop_timeout` and reading `_read_timeout`, `_read_timeout_handle`,
  `_on_read_timeout` (two timers fewer per request: CHANGELOG.md, "Performance history").

Both are private, so `pyproject.toml` pins aiohttp to the minor series they were tested on, and this
file fails the day an aiohttp within (or outside) that pin moves them.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from pathlib import Path

import aiohttp
from aiohttp.client_proto import ResponseHandler

from kotoba_vllm._aiohttp_wire import Connector, CountingHandler

PYPROJECT = Path(__file__).parent.parent / "pyproject.toml"


def _pin() -> tuple[tuple[int, ...], tuple[int, ...]]:
    m = re.search(r'"aiohttp>=([\d.]+),<([\d.]+)"', PYPROJECT.read_text())
    assert m, "aiohttp is pinned in pyproject.toml as aiohttp>=X.Y,<X.Z"
    return tuple(map(int, m.group(1).split("."))), tuple(map(int, m.group(2).split(".")))


def test_the_installed_aiohttp_is_the_tested_series() -> None:
    low, high = _pin()
    have = tuple(int(p) for p in re.findall(r"\d+", aiohttp.__version__)[:3])
    assert low <= have < high, f"aiohttp {aiohttp.__version__} is outside the tested pin {low}..{high}"
    assert high[:1] == low[:1] and len(high) == 2 and high[1] == low[1] + 1, "the pin spans one minor series"


def test_the_private_names_the_wire_overrides_are_still_there() -> None:
    src = inspect.getsource(ResponseHandler)
    for name in ("def _reschedule_timeout(self", "def _drop_timeout(self", "def _on_read_timeout(self",
                 "self._read_timeout_handle", "self._read_timeout ="):
        assert name in src, f"aiohttp's ResponseHandler no longer has {name!r}: CountingHandler must change"
    assert "self._factory = functools.partial(ResponseHandler, loop=loop)" in inspect.getsource(aiohttp.connector)


def test_the_connector_builds_counting_protocols() -> None:
    async def go() -> None:
        conn = Connector()
        try:
            proto = conn._factory()  # what aiohttp calls for every connection it opens
            assert isinstance(proto, CountingHandler) and proto.bytes_in == 0
        finally:
            await conn.close()

    asyncio.run(go())
