"""The effective serving configuration as typed data, with its EDN shape.

One answer per endpoint::

    {:config/endpoint "http://h:8080" :config/engine :llamacpp :config/measured? true
     :config/at "2026-12-01T20:40:00.000Z"
     :config/fields {:config/context-per-slot {:config/value 512
                                               :config/source {:config/path "/props"
                                                               :config/key ["default_generation_settings" "n_ctx"]}
                                               :config/means "tokens one slot holds (-c divided by --parallel)"}
                     :config/tensor-parallel :unreported
                     :config/slot-contexts {:config/unmeasured "GET /slots: HTTP 501 ..."}}
     :config/probes [{:config/path "/props" :config/status 200 :config/ms 1.2}]}

A field is reported (a value, nil included when the server says nil, and where it came from),
`:unreported` (the engine does not say), or unmeasured (the endpoint that says it failed, and why).
An endpoint nobody could read is unmeasured as a whole, with its reason and no fields.
"""

from __future__ import annotations

from typing import Mapping

import attrs

from .._edn import Edn, Keyword, kw
from .._errors import StructureError
from .._problems import Problem

REPORTED, UNREPORTED, UNMEASURED = "reported", "unreported", "unmeasured"
K_UNREPORTED = kw("unreported")


@attrs.frozen
class Source:
    """Which endpoint said it, and where in its answer: a JSON key path, or a metric and label."""

    path: str
    key: tuple[str | int, ...]

    def to_edn(self) -> dict[Keyword, Edn]:
        return {kw("config/path"): self.path, kw("config/key"): list(self.key)}

    @classmethod
    def from_edn(cls, m: Edn) -> "Source":
        m = _map(m, "a :config/source")
        path, key = m.get(kw("config/path")), m.get(kw("config/key"))
        if not isinstance(path, str) or not isinstance(key, (list, tuple)) or \
                not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in key):
            raise _bad(":config/source needs :config/path (a string) and :config/key (a vector of strings/ints)")
        return cls(path, tuple(key))

    def text(self) -> str:
        return f"{self.path} {'.'.join(str(k) for k in self.key)}"


@attrs.frozen
class ConfigField:
    """One property of the running server."""

    status: str  # reported | unreported | unmeasured
    value: Edn = None
    source: Source | None = None
    derived_from: tuple[Source, ...] = ()  # a computed field: its inputs (and `how`)
    how: str | None = None
    means: str | None = None
    reason: str | None = None  # unmeasured: why

    @property
    def reported(self) -> bool:
        return self.status == REPORTED

    def to_edn(self) -> Edn:
        if self.status == UNREPORTED:
            return K_UNREPORTED
        if self.status == UNMEASURED:
            return {kw("config/unmeasured"): self.reason or "unread"}
        out: dict[Keyword, Edn] = {kw("config/value"): self.value}
        if self.source is not None:
            out[kw("config/source")] = self.source.to_edn()
        if self.derived_from:
            out[kw("config/derived-from")] = [s.to_edn() for s in self.derived_from]
            out[kw("config/how")] = self.how
        if self.means:
            out[kw("config/means")] = self.means
        return out

    @classmethod
    def from_edn(cls, v: Edn) -> "ConfigField":
        if v == K_UNREPORTED:
            return cls(UNREPORTED)
        m = _map(v, "a config field (:unreported or a map)")
        if kw("config/unmeasured") in m:
            why = m[kw("config/unmeasured")]
            return cls(UNMEASURED, reason=why if isinstance(why, str) else str(why))
        if kw("config/value") not in m:
            raise _bad("a reported config field carries :config/value")
        src = m.get(kw("config/source"))
        derived = m.get(kw("config/derived-from")) or []
        how, means = m.get(kw("config/how")), m.get(kw("config/means"))
        return cls(REPORTED, value=m[kw("config/value")], source=None if src is None else Source.from_edn(src),
                   derived_from=tuple(Source.from_edn(s) for s in derived) if isinstance(derived, list) else (),
                   how=how if isinstance(how, str) else None, means=means if isinstance(means, str) else None)


def reported(value: Edn, source: Source, means: str | None = None) -> ConfigField:
    return ConfigField(REPORTED, value=value, source=source, means=means)


def unmeasured(reason: str) -> ConfigField:
    return ConfigField(UNMEASURED, reason=reason)


NOT_REPORTED = ConfigField(UNREPORTED)


@attrs.frozen
class Probe:
    """One path asked: its HTTP status and time, or why it gave nothing."""

    path: str
    status: int | None = None
    ms: float | None = None
    reason: str | None = None

    def to_edn(self) -> dict[Keyword, Edn]:
        out: dict[Keyword, Edn] = {kw("config/path"): self.path}
        for k, v in (("status", self.status), ("ms", self.ms), ("reason", self.reason)):
            if v is not None:
                out[kw("config/" + k)] = v
        return out

    @classmethod
    def from_edn(cls, m: Edn) -> "Probe":
        m = _map(m, "a :config/probes item")
        path = m.get(kw("config/path"))
        if not isinstance(path, str):
            raise _bad("a probe carries :config/path")
        status, ms, reason = (m.get(kw("config/" + k)) for k in ("status", "ms", "reason"))
        return cls(path, status if isinstance(status, int) else None,
                   float(ms) if isinstance(ms, (int, float)) else None, reason if isinstance(reason, str) else None)


@attrs.frozen
class ServerConfig:
    """What one endpoint says it runs. `fields` in table order (see `FIELD_NAMES`)."""

    endpoint: str
    measured: bool
    engine: str | None = None
    fields: Mapping[str, ConfigField] = attrs.field(factory=dict)
    probes: tuple[Probe, ...] = ()
    at: str | None = None
    reason: str | None = None  # unmeasured: why nothing could be read
    reachable: bool | None = None

    def get(self, name: str) -> ConfigField:
        """The field by name (`"context-length"`); `:unreported` when the table has no such row for this engine."""
        return self.fields.get(name, NOT_REPORTED)

    def value(self, name: str) -> Edn:
        """The reported value, or None (unreported, unmeasured, or reported as nil: see `get`)."""
        f = self.get(name)
        return f.value if f.reported else None

    def to_edn(self) -> dict[Keyword, Edn]:
        out: dict[Keyword, Edn] = {kw("config/endpoint"): self.endpoint, kw("config/measured?"): self.measured}
        if self.engine is not None:
            out[kw("config/engine")] = kw(self.engine)
        if self.at is not None:
            out[kw("config/at")] = self.at
        if self.reason is not None:
            out[kw("config/reason")] = self.reason
        if self.reachable is not None:
            out[kw("config/reachable?")] = self.reachable
        if self.fields:
            out[kw("config/fields")] = {kw("config/" + n): f.to_edn() for n, f in self.fields.items()}
        if self.probes:
            out[kw("config/probes")] = [p.to_edn() for p in self.probes]
        return out

    @classmethod
    def from_edn(cls, m: Edn) -> "ServerConfig":
        m = _map(m, "a server config")
        endpoint, measured = m.get(kw("config/endpoint")), m.get(kw("config/measured?"))
        if not isinstance(endpoint, str) or not isinstance(measured, bool):
            raise _bad("a server config carries :config/endpoint (a string) and :config/measured? (true/false)")
        engine = m.get(kw("config/engine"))
        fields = _map(m.get(kw("config/fields")) or {}, ":config/fields")
        probes = m.get(kw("config/probes")) or []
        at, reason, reachable = (m.get(kw("config/" + k)) for k in ("at", "reason", "reachable?"))
        return cls(endpoint=endpoint, measured=measured, engine=engine.name if isinstance(engine, Keyword) else None,
                   fields={k.name.split("/", 1)[-1]: ConfigField.from_edn(v) for k, v in fields.items()
                           if isinstance(k, Keyword)},
                   probes=tuple(Probe.from_edn(p) for p in probes) if isinstance(probes, list) else (),
                   at=at if isinstance(at, str) else None, reason=reason if isinstance(reason, str) else None,
                   reachable=reachable if isinstance(reachable, bool) else None)


def _bad(msg: str) -> StructureError:
    return StructureError([Problem("error", "config/shape", msg)])


def _map(v: Edn, what: str) -> Mapping[object, Edn]:
    if not isinstance(v, dict):
        raise _bad(f"{what} must be a map")
    return v
