"""The flags each engine's own argument parser defines, read from schemas/engine-flags/.

The data names the engine version and the source files it was read from, so a flag
renamed upstream shows up as a failing test instead of a launch that dies on a node.
"""

from __future__ import annotations

import functools
import re
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


_OPTION = re.compile(r"^-{1,2}[A-Za-z0-9][\w.-]*$")


def parse_help_flags(text: str) -> tuple[list[str], list[str]]:
    """(flags, removed flags) of a `llama-server --help` text. An option line starts at column 0 with
    its names, comma-separated, then a value placeholder or the description; a line whose description
    says "has been removed" names options the parser still knows only to refuse them."""
    flags: set[str] = set()
    removed: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("-") or line.startswith("-----"):
            continue
        names = []
        for tok in line.replace(",", " ").split():
            if not _OPTION.match(tok):
                break
            names.append(tok)
        (removed if "has been removed" in line else flags).update(names)
    return sorted(flags), sorted(removed - flags)


def render_flags_table(engine: str, version: str, source: str, how: str, flags: Sequence[str],
                       removed: Sequence[str] = ()) -> str:
    """The engine-flags EDN file, in the layout of the committed ones."""
    quoted = "\n  ".join(f'"{f}"' for f in flags)
    gone = " ".join(f'"{f}"' for f in removed)
    return (f";; Flags defined by {engine}'s own argument parser, kept as data so a renamed\n"
            ";; flag fails a test (tests/test_distributed_emit.py). Regenerate with scripts/llamacpp-flags;\n"
            ";; do not hand-edit single flags.\n"
            f'{{:flags/engine :{engine}\n :flags/version "{version}"\n :flags/source "{source}"\n'
            f' :flags/how "{how}"\n :flags/removed [{gone}]\n :flags/flags\n [{quoted}]}}\n')
