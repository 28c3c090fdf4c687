"""Validation problems: data, never exceptions, until a caller decides to raise."""

from __future__ import annotations

from typing import Iterable, Mapping

import attrs

from ._edn import Edn, Keyword, kw


@attrs.frozen
class Problem:
    """`{:vllm/severity :error :vllm/code :sampling/range :vllm/field :vllm/temperature :vllm/msg ".."}`.

    `where` is `file:line:column` when the problem came from a located EDN form.
    """

    severity: str  # "error" | "warn"
    code: str  # namespaced, e.g. "sampling/range"
    msg: str
    field: str | None = None  # namespaced key name, e.g. "vllm/temperature"
    engine: str | None = None
    where: str | None = None

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def to_edn(self) -> dict[Keyword, Edn]:
        out: dict[Keyword, Edn] = {kw("vllm/severity"): kw(self.severity), kw("vllm/code"): kw(self.code)}
        if self.field is not None:
            out[kw("vllm/field")] = kw(self.field)
        out[kw("vllm/msg")] = self.msg
        if self.engine is not None:
            out[kw("vllm/engine")] = kw(self.engine)
        if self.where is not None:
            out[kw("vllm/where")] = self.where
        return out

    @classmethod
    def from_edn(cls, m: Mapping[Keyword, Edn]) -> "Problem":
        def name(k: str) -> str | None:
            v = m.get(kw(k))
            return v.name if isinstance(v, Keyword) else None if v is None else str(v)

        def text(k: str) -> str | None:
            v = m.get(kw(k))
            return v if isinstance(v, str) else None

        return cls(severity=name("vllm/severity") or "error", code=name("vllm/code") or "unknown",
                   msg=text("vllm/msg") or "", field=name("vllm/field"), engine=name("vllm/engine"),
                   where=text("vllm/where"))

    def __str__(self) -> str:
        loc = f"{self.where}: " if self.where else ""
        return f"{loc}{self.severity}: {self.msg}"


def has_errors(problems: Iterable[Problem]) -> bool:
    return any(p.is_error for p in problems)
