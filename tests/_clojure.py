"""The real Clojure reader, one JVM for the whole session (tests/interop/edn_probe.clj).

`canonical(v)` writes a value the way the probe's `dump` does, so a Python value and what
clojure.edn made of some text compare as plain strings. Every dump tags the EDN type:
"a"/:a, [1]/(1), 1/1N/1.0M and \\a/"a" all differ.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import shutil
import struct
import subprocess
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

from kotoba_vllm._edn import BigInt, Char, Keyword, Symbol

PROBE = Path(__file__).resolve().parent / "interop" / "edn_probe.clj"
CLOJURE_JAR = Path("/usr/share/java/clojure.jar")
LONG = range(-(2 ** 63), 2 ** 63)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


class ClojureUnavailable(RuntimeError):
    pass


def _hexs(s: str) -> str:
    return ",".join("%x" % ord(c) for c in s)


def canonical(v: Any) -> str:
    """The probe's dump of `v` (see edn_probe.clj)."""
    if v is None:
        return "nil"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, BigInt) or isinstance(v, int) and v not in LONG:
        return f"(N {int(v)})"
    if isinstance(v, int):
        return f"(L {v})"
    if isinstance(v, float):
        bits = 0x7FF8000000000000 if math.isnan(v) else struct.unpack(">Q", struct.pack(">d", v))[0]
        return "(D %x)" % bits
    if isinstance(v, Decimal):
        sign, digits, exp = v.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        return f"(M {unscaled} {-int(exp)})"
    if isinstance(v, Char):
        return "(C %x)" % ord(v)
    if isinstance(v, str):
        return f"(S {_hexs(v)})"
    if isinstance(v, Keyword):
        return f"(K {_hexs(v.name)})"
    if isinstance(v, Symbol):
        return f"(Y {_hexs(v.name)})"
    if isinstance(v, dict):
        return "(A" + "".join(sorted(f" {canonical(k)} {canonical(x)}" for k, x in v.items())) + ")"
    if isinstance(v, list):
        return "(V" + "".join(" " + canonical(x) for x in v) + ")"
    if isinstance(v, tuple):
        return "(P" + "".join(" " + canonical(x) for x in v) + ")"
    if isinstance(v, (set, frozenset)):
        return "(H" + "".join(sorted(" " + canonical(x) for x in v)) + ")"
    if isinstance(v, dt.datetime):
        aware = v if v.tzinfo is not None else v.replace(tzinfo=dt.timezone.utc)
        return f"(T {(aware - EPOCH) // dt.timedelta(milliseconds=1)})"
    if isinstance(v, uuid.UUID):
        return f"(U {v})"
    return f"(? {type(v).__name__})"


def canonical_forms(values: list[Any]) -> str:
    return "ok" + "".join(" " + canonical(v) for v in values)


class Clojure:
    """clojure.edn behind a pipe: `read(text)` answers "ok <dumps>" or "err <message>"."""

    def __init__(self) -> None:
        java = shutil.which("java")
        if java is None or not CLOJURE_JAR.exists():
            raise ClojureUnavailable(f"needs java and {CLOJURE_JAR} (Debian: apt-get install -y clojure)")
        self.proc = subprocess.Popen([java, "-Xss8m", "-cp", str(CLOJURE_JAR), "clojure.main", str(PROBE)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     encoding="utf-8", errors="replace")  # messages quote the text
        first = self._line()
        if first != "ready":
            raise ClojureUnavailable(f"the Clojure probe did not start: {first!r}")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise ClojureUnavailable(f"the Clojure probe exited ({self.proc.poll()})")
        return line.rstrip("\n")

    def _ask(self, line: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._line()

    def read(self, text: str) -> str:
        """What clojure.edn reads from `text`: "ok <dump>..." (every form) or "err <message>"."""
        return self._ask("read " + base64.b64encode(text.encode("utf-8")).decode("ascii"))

    def generate(self, seed: int, n: int) -> list[tuple[str, str]]:
        """`n` values Clojure made and printed with pr-str: (text, dump) pairs."""
        head = self._ask(f"gen {seed} {n}")
        assert head.startswith("ok "), head
        out = []
        for _ in range(int(head.split()[1])):
            b64, dump = self._line().split(" ", 1)
            out.append((base64.b64decode(b64).decode("utf-8"), dump))
        return out

    def whitespace(self) -> list[int]:
        return [int(h, 16) for h in self._ask("ws").split()[1:]]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            self.proc.kill()
