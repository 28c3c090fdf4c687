"""The flags each engine's own argument parser defines, read from schemas/engine-flags/.

The data names the engine version and the source files it was read from, so a flag
renamed upstream shows up as a failing test instead of a launch that dies on a node.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Sequence

import attrs

from .._edn import EdnError, Keyword, kw, read_file

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas" / "engine-flags"
# llama.cpp's table is what `llama-server --help` prints for the build the project ships (scripts/llamacpp-flags).
CHECKED_ENGINES = ("vllm", "sglang", "llamacpp")


@attrs.frozen
class EngineFlags:
    engine: str
    version: str
    source: str
    flags: frozenset[str]

    def unknown(self, used: Sequence[str]) -> list[str]:
        return [f for f in used if f not in self.flags]

    @property
    def label(self) -> str:
        return f"{self.engine} {self.version}"


@functools.lru_cache(maxsize=None)
def engine_flags(engine: str, schema_dir: Path = SCHEMA_DIR) -> EngineFlags:
    form = read_file(str(schema_dir / f"{engine}.edn"))[0]
    m = form.value
    name, version, source = (m.get(kw(k)) if isinstance(m, dict) else None
                             for k in ("flags/engine", "flags/version", "flags/source"))
    flags = m.get(kw("flags/flags")) if isinstance(m, dict) else None
    if not (isinstance(name, Keyword) and isinstance(version, str) and isinstance(source, str)
            and isinstance(flags, (list, tuple)) and all(isinstance(f, str) for f in flags)):
        raise EdnError("an engine-flags file is {:flags/engine :k :flags/version \"..\" :flags/source \"..\" "
                       ":flags/flags [\"--flag\" ...]}", form.source, form.line, form.column)
    return EngineFlags(engine=name.name, version=version, source=source,
                       flags=frozenset(f for f in flags if isinstance(f, str)))
