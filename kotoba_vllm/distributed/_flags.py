"""The flags each engine's own argument parser defines, read from schemas/engine-flags/.

The data names the engine version and the source files it was read from, so a flag
renamed upstream shows up as a failing test instead of a launch that dies on a node.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Sequence

import attrs

from .._edn import kw, read_file

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas" / "engine-flags"
CHECKED_ENGINES = ("vllm", "sglang")  # llama.cpp's flags live in C++; its live test runs them


@attrs.frozen
class EngineFlags:
    engine: str
    version: str
    source: str
    flags: frozenset[str]

    def unknown(self, used: Sequence[str]) -> list[str]:
        return [f for f in used if f not in self.flags]


@functools.lru_cache(maxsize=None)
def engine_flags(engine: str, schema_dir: Path = SCHEMA_DIR) -> EngineFlags:
    m = read_file(str(schema_dir / f"{engine}.edn"))[0].value
    return EngineFlags(engine=m[kw("flags/engine")].name, version=m[kw("flags/version")],
                       source=m[kw("flags/source")], flags=frozenset(m[kw("flags/flags")]))
