"""EDN <-> typed conversion rules, registered once on a cattrs converter.

Each attrs field says its EDN key and its codec in field metadata (see `edn_field`).
The generated hooks turn EDN maps into frozen attrs instances and back; bad input
becomes `Problem`s that name the key and, for located forms, file:line:column.
JSON-like values (tool schemas, guided JSON) are kept as EDN and turned into JSON
only when a dialect renders a request (`edn_to_json`).
"""

from __future__ import annotations

import itertools
import linecache
import math
from decimal import Decimal
from typing import AbstractSet, Any, Callable, Iterable, NamedTuple, TypeVar

import attrs
import cattrs

from ._keywords import InternedKeyword
from ._edn import Char, Edn, Form, Keyword, Symbol, dumps, is_keyword_name, keyword_or_string, kw
from ._errors import EdnWriteError, StructureError
from ._memo import BoundedMemo, IdentityMemo
from ._problems import Problem

T = TypeVar("T")

edn_converter = cattrs.Converter()


class Ctx:
    """Collects problems while structuring; knows the form for positions."""

    __slots__ = ("problems", "form")

    def __init__(self, form: Form | None = None) -> None:
        self.problems: list[Problem] = []
        self.form = form

    def where(self, mapping: object, key: Edn) -> str | None:
        if self.form is None:
            return None
        loc = self.form.locate(mapping, key)
        if loc is None:
            return self.form.where
        return f"{self.form.source}:{loc[0]}:{loc[1]}"

    def bad(self, code: str, msg: str, field: str | None, mapping: object = None, key: Edn = None) -> None:
        self.problems.append(Problem("error", code, msg, field=field, where=self.where(mapping, key)))


class _Bad(Exception):
    def __init__(self, msg: str) -> None:
        self.msg = msg


# ------------------------------------------------------------------ codecs


class Codec:
    """to_edn: typed value -> EDN value; from_edn: EDN -> typed (raise _Bad)."""

    name = "value"

    def to_edn(self, v: Edn) -> Edn:  # scalars are their own EDN; collections and classes override
        return v

    def from_edn(self, v: Edn, ctx: Ctx, field: str) -> Any:
        return v

    def write(self, v: Any) -> str | None:
        """EDN text of `to_edn(v)`, None when that is nil (`write_edn` writes without building maps)."""
        e = self.to_edn(v)
        return None if e is None else dumps(e)


class _Scalar(Codec):
    def __init__(self, name: str, check: Callable[[Any], bool], conv: Callable[[Any], Any] = lambda v: v) -> None:
        self.name, self.check, self.conv = name, check, conv

    def from_edn(self, v: Edn, ctx: Ctx, field: str) -> Any:
        if not self.check(v):
            raise _Bad(f"expected {self.name}, got {describe(v)}")
        return self.conv(v)


STR = _Scalar("a string", lambda v: type(v) is str)
INT = _Scalar("an integer", lambda v: type(v) is int)
NUM = _Scalar("a number", lambda v: type(v) in (int, float) or isinstance(v, Decimal),
              lambda v: float(v) if isinstance(v, Decimal) else v)
BOOL = _Scalar("true or false", lambda v: type(v) is bool)
INT_OR_BOOL = _Scalar("an integer or true/false", lambda v: type(v) in (int, bool))


class _Kw(Codec):
    """A keyword in EDN, its name as str in Python (`:user` <-> "user")."""

    def __init__(self, choices: Iterable[str] | None = None, namespace: str | None = None) -> None:
        self.choices = tuple(choices) if choices else None
        self.namespace = namespace
        self.name = "one of " + " ".join(":" + c for c in self.choices) if self.choices else "a keyword"
        self._text: BoundedMemo[str, str] = BoundedMemo(1024)  # name -> its checked EDN text

    def to_edn(self, v: Any) -> Edn:
        return kw(f"{self.namespace}/{v}" if self.namespace else v)

    def write(self, v: Any) -> str | None:
        t = self._text.get(v) if type(v) is str else None
        if t is None:
            t = dumps(self.to_edn(v))
            if type(v) is str:
                self._text.keep(v, t)
        return t

    def from_edn(self, v: Edn, ctx: Ctx, field: str) -> Any:
        if not isinstance(v, Keyword):
            raise _Bad(f"expected {self.name}, got {describe(v)}")
        name = v.name
        if self.namespace:
            if not name.startswith(self.namespace + "/"):
                raise _Bad(f"expected a :{self.namespace}/ keyword, got {v}")
            name = name[len(self.namespace) + 1:]
        if self.choices and name not in self.choices:
            raise _Bad(f"expected {self.name}, got {v}")
        return name


def KW(*choices: str, namespace: str | None = None) -> Codec:
    return _Kw(choices or None, namespace)


class _Word(Codec):
    """A server's word (a finish reason): a keyword when it can be one, else the string as sent.

    Python holds the server's spelling (`"tool_calls"`, `"stop sequence"`); EDN holds
    `:tool_calls` or `"stop sequence"`, as the Clojure library does for valid keywords.
    """

    name = "a keyword or a string"

    def to_edn(self, v: Any) -> Edn:
        return keyword_or_string(v)

    def from_edn(self, v: Edn, ctx: Ctx, field: str) -> Any:
        if isinstance(v, Keyword):
            return v.name
        if type(v) is str:
            return v
        raise _Bad(f"expected {self.name}, got {describe(v)}")


WORD = _Word()


class _NilWhenEmpty(Codec):
    """Text that is nil in EDN when empty (a final stream delta), "" in Python so deltas join."""

    name = "a string or nil"

    def to_edn(self, v: Any) -> Edn:
        return v or None

    def from_edn(self, v: Edn, ctx: Ctx, field: str) -> Any:
        if type(v) is not str:
            raise _Bad(f"expected {self.name}, got {describe(v)}")
        return v


TEXT_OR_NIL = _NilWhenEmpty()


class _Many(Codec):
    def __init__(self, item: Codec) -> None:
        self.item, self.name = item, f"a vector of {item.name}"

    def to_edn(self, v: Any) -> Edn:
        return [self.item.to_edn(x) for x in v]

    def write(self, v: Any) -> str | None:
        w = self.item.write
        return "[" + " ".join([_nil_text(w(x)) for x in v]) + "]"

    def from_edn(self, v: Edn, ctx: Ctx, field: str) -> Any:
        if not isinstance(v, (list, tuple)):
            raise _Bad(f"expected {self.name}, got {describe(v)}")
        from_edn = self.item.from_edn
        return tuple([from_edn(x, ctx, field) for x in v])  # a list first: no generator to resume per item


def MANY(item: Codec) -> Codec:
    return _Many(item)


class _OneOf(Codec):
    """First codec that accepts the value wins (e.g. a string or a vector of strings)."""

    def __init__(self, *options: Codec) -> None:
        self.options, self.name = options, " or ".join(o.name for o in options)

    def to_edn(self, v: Any) -> Edn:
        for o in self.options:
            if isinstance(o, _Many) and isinstance(v, tuple):
                return o.to_edn(v)
            if isinstance(o, _Nested) and isinstance(v, o.cls):
                return o.to_edn(v)
        scalar: Edn = v  # none of the collection options: a scalar, its own EDN
        return scalar

    def from_edn(self, v: Edn, ctx: Ctx, field: str) -> Any:
        for o in self.options:
            if isinstance(o, _Scalar) and not o.check(v):
                continue  # skip building the refusal message a later option makes moot
            try:
                return o.from_edn(v, ctx, field)
            except _Bad:
                continue
        raise _Bad(f"expected {self.name}, got {describe(v)}")


def ONE_OF(*options: Codec) -> Codec:
    return _OneOf(*options)


class _Nested(Codec):
    def __init__(self, cls: type[Any]) -> None:
        self.cls = cls
        self.name = f"a {cls.__name__} map"

    def to_edn(self, v: Any) -> Edn:
        out: dict[Keyword, Edn] = edn_converter.unstructure(v)  # the hooks registered below
        return out

    def write(self, v: Any) -> str | None:
        return write_edn(v)

    def from_edn(self, v: Edn, ctx: Ctx, field: str) -> Any:
        if not isinstance(v, dict):
            raise _Bad(f"expected {self.name}, got {describe(v)}")
        shared = _SHARED_MAPS.get(self.cls)
        key = None
        if shared is not None:
            key = _scalar_items(v)
            hit = shared.get(key) if key is not None else None
            if hit is not None:
                return hit
        before = len(ctx.problems)
        out = _structure_map(self.cls, v, ctx)
        if shared is not None and key is not None and out is not None and len(ctx.problems) == before:
            shared.keep(key, out)
        if len(ctx.problems) > before:  # a nested problem with no field (a non-keyword key): the enclosing key's
            ctx.problems[before:] = [attrs.evolve(p, field=field) if p.field is None else p
                                     for p in ctx.problems[before:]]
        if out is None:
            raise _Bad("")  # problems already recorded inside
        return out


def NESTED(cls: type) -> Codec:
    return _Nested(cls)


# Classes whose nested maps are structured once per distinct map (a batch repeats the same `:vllm/sampling`
# on every line): class -> {the map's (key, value type, value) entries: the frozen instance}. One instance
# per distinct map also lets the memos keyed by identity (a clean Sampling, its rendered wire fields) hit.
_SHARED_MAPS: dict[type, BoundedMemo[tuple[Any, ...], Any]] = {}
_SCALARS = frozenset((str, int, bool, InternedKeyword, Keyword, type(None)))


def share_structured(cls: type[T]) -> type[T]:
    """Structure equal nested maps of `cls` (frozen, scalar fields) into one shared instance."""
    _SHARED_MAPS[cls] = BoundedMemo(256)
    return cls


def _scalar_items(m: dict[Any, Any]) -> tuple[Any, ...] | None:
    """A key that tells maps apart exactly as structuring does, or None when a value is not a plain scalar.
    The value's type is part of it (`1`, `1.0` and `true` are equal in Python, not in EDN); a float
    is keyed by its repr (`0.0` equals `-0.0`; NaN equals nothing)."""
    out: list[Any] = []
    for k, v in m.items():
        t = type(k)
        if t is not InternedKeyword and t is not Keyword:
            return None
        t = type(v)
        if t is float:
            v = repr(v)
        elif t not in _SCALARS:
            return None
        out.append(k)
        out.append(t)
        out.append(v)
    return tuple(out)


class _Json(Codec):
    """JSON-like data kept as EDN (maps, vectors, strings, numbers, keywords)."""

    name = "JSON-like data"

    def from_edn(self, v: Edn, ctx: Ctx, field: str) -> Any:
        bad = _non_json(v)
        if bad is not None:
            raise _Bad(f"cannot be sent as JSON: {bad}")
        return v


JSON = _Json()
ANY = Codec()


def describe(v: object) -> str:

    try:
        text = dumps(v)
    except TypeError:
        text = repr(v)
    if len(text) > 40:
        text = text[:37] + "..."
    kind = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "map", list: "vector",
            tuple: "list", type(None): "nil"}.get(type(v), type(v).__name__.lower())
    return f"{kind} {text}"


def _non_json(v: Edn) -> str | None:
    if isinstance(v, float) and not math.isfinite(v) or isinstance(v, Decimal) and not v.is_finite():
        return f"{describe(v)} (JSON has no NaN or infinity)"  # httpx would refuse it at send time
    if v is None or isinstance(v, (str, bool, int, float, Keyword, Decimal)):
        return None
    if isinstance(v, (list, tuple)):
        for x in v:
            r = _non_json(x)
            if r:
                return r
        return None
    if isinstance(v, dict):
        for k, x in v.items():
            if not isinstance(k, (str, Keyword)):
                return f"map key {describe(k)}"
            r = _non_json(x)
            if r:
                return r
        return None
    return describe(v)


def json_problem(v: Edn) -> str | None:
    """Why `v` cannot be sent as JSON, or None when it can."""
    bad = _non_json(v)
    return None if bad is None else f"cannot be sent as JSON: {bad}"


def edn_to_json(v: Edn) -> Any:
    """EDN data -> JSON-ready Python: keywords become their (unqualified) names."""
    if isinstance(v, dict):
        return {(k.name.rsplit("/", 1)[-1] if isinstance(k, Keyword) else k): edn_to_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [edn_to_json(x) for x in v]
    if isinstance(v, Keyword):
        return v.name.rsplit("/", 1)[-1]
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, (Symbol, Char)):
        return str(v)
    return v


def json_to_edn(v: Any) -> Edn:
    """JSON value -> EDN data: object keys become plain keywords (`{"prompt_n": 4}` -> `{:prompt_n 4}`)."""
    if isinstance(v, dict):
        return {kw(k) if plain_key(k) else k: json_to_edn(x) for k, x in v.items()}
    if isinstance(v, list):
        return [json_to_edn(x) for x in v]
    scalar: Edn = v  # JSON's other values (str, int, float, bool, None) are EDN as they are
    return scalar


def plain_key(k: object) -> bool:
    # a JSON key becomes a keyword only when every EDN reader reads it back as that key; "/" would add a namespace
    return isinstance(k, str) and "/" not in k and is_keyword_name(k)


# ------------------------------------------------------------------ fields


def edn_field(key: str, codec: Codec = ANY, default: Any = None, *, always: bool = False, **kwargs: Any) -> Any:
    """An attrs field that reads and writes EDN key `key` (e.g. "vllm/model").
    `always`: written even when nil (a stream delta's `:vllm/delta` and `:vllm/finish-reason`)."""
    meta = {"edn": key, "codec": codec}
    if always:
        meta["always"] = True
    return attrs.field(default=default, metadata=meta, **kwargs)


EXTRAS_META = "edn_extras"


def extras_field(namespaces: tuple[str, ...], known: AbstractSet[str] = frozenset()) -> Any:
    """Keys in these namespaces that the class does not model are kept here as {name: EDN value}; in the
    library's own `vllm` namespace only the `known` names (engine fields from a table)."""
    return attrs.field(factory=dict, metadata={EXTRAS_META: namespaces, EXTRAS_KNOWN: frozenset(known)},
                       hash=False, eq=True)


EXTRAS_KNOWN = "edn_extras_known"


class FieldWriter(NamedTuple):
    """How one field of a registered class is written into its map's text."""

    attr: str
    key: Keyword
    key_text: str  # ":vllm/model "
    write: Callable[[Any], "str | None"]  # text of a non-nil value, or None for nil
    always: bool  # written (as nil) when nil
    default: "tuple[Any, str] | None"  # a frozen default object and its text, written once


def _plain(codec: Codec) -> bool:
    """The codec writes a non-nil value as `dumps(value)`: its EDN is the value itself."""
    t = type(codec)
    return t.to_edn is Codec.to_edn and t.write is Codec.write


class _Spec:
    __slots__ = ("cls", "by_key", "by_id", "field_names", "fields", "extras_attr", "extras_ns", "extras_known",
                 "required", "always",
                 "writers", "default_texts", "_field_writers")

    def __init__(self, cls: type[Any]) -> None:
        self.cls = cls
        # key -> (attribute, codec, the key's name): `Keyword.name` is a Python property, read once here
        self.by_key: dict[Keyword, tuple[str, Codec, str]] = {}
        self.fields: list[tuple[str, Keyword, Codec]] = []
        self.extras_attr: str | None = None
        self.extras_ns: tuple[str, ...] = ()
        self.extras_known: frozenset[str] = frozenset()
        self.required: list[str] = []
        self.always: frozenset[str] = frozenset(a.name for a in attrs.fields(cls) if a.metadata.get("always"))
        for a in attrs.fields(cls):
            if EXTRAS_META in a.metadata:
                self.extras_attr, self.extras_ns = a.name, a.metadata[EXTRAS_META]
                self.extras_known = a.metadata.get(EXTRAS_KNOWN, frozenset())
            elif "edn" in a.metadata:
                k = kw(a.metadata["edn"])
                self.by_key[k] = (a.name, a.metadata["codec"], k.name)
                self.fields.append((a.name, k, a.metadata["codec"]))
                if a.default is attrs.NOTHING:
                    self.required.append(a.name)
        # the same entries by the id of each (interned, never freed) key
        self.by_id: dict[int, tuple[str, Codec, str]] = {id(k): e for k, e in self.by_key.items()}
        self.field_names = frozenset(k.name for k in self.by_key)  # "vllm/text": the names extras are kept by
        # attribute -> (its default object, that object's text), for defaults that are registered frozen values
        self.default_texts: dict[str, tuple[Any, str]] = {}
        for a in attrs.fields(cls):
            d = a.default
            if "edn" in a.metadata and type(d) in _REGISTERED and _frozen(d):
                self.default_texts[a.name] = (d, write_edn(d))
        # (attribute, key, "key " text, the value's writer, written when nil, (default, its text) or None)
        # for `write_edn`; a codec whose EDN is the value itself is written by `dumps` directly, a nested
        # class by `write_edn` directly (what `_Nested.write` calls)
        self.writers: list[FieldWriter] = [
            FieldWriter(name, k, dumps(k) + " ", _value_writer(codec), name in self.always, self.default_texts.get(name))
            for name, k, codec in self.fields]
        self._field_writers: dict[frozenset[Keyword], Callable[[Any], list[str]]] = {}

    def field_writer(self, skip: AbstractSet[Keyword]) -> Callable[[Any], list[str]]:
        """The "key value" texts of an instance's fields, less the keys in `skip`: one function per class and
        skip set, made once (a record skips the same keys every time)."""
        key = skip if isinstance(skip, frozenset) else frozenset(skip)
        out = self._field_writers.get(key)
        if out is None:
            out = self._field_writers[key] = _compile_field_writer(
                self.cls.__name__, [w for w in self.writers if w.key not in key])
        return out


def _compile_field_writer(cls_name: str, writers: list[FieldWriter]) -> Callable[[Any], list[str]]:
    """The loop over `writers` unrolled into straight code, generated once per class and skip set the way
    attrs makes `__init__`: per field, an attribute read by name and a test instead of a tuple unpacked
    and a `getattr` call, once per field of every record. The source is registered with `linecache`, so a
    traceback through it shows the generated line."""
    names: dict[str, Any] = {}
    body = ["def write_fields(obj):", "    parts = []", "    add = parts.append"]
    for w in writers:
        names[f"write_{w.attr}"] = w.write
        nil = f"add({w.key_text + 'nil'!r})" if w.always else "pass"
        body += [f"    v = obj.{w.attr}", "    if v is None:", f"        {nil}"]
        if w.default is not None:  # a field holding its (frozen, shared) default object: its text once
            names[f"default_{w.attr}"] = w.default[0]
            body += [f"    elif v is default_{w.attr}:", f"        add({w.key_text + w.default[1]!r})"]
        body += ["    else:", f"        text = write_{w.attr}(v)", "        if text is None:", f"            {nil}",
                 "        else:", f"            add({w.key_text!r} + text)"]
    body.append("    return parts")
    source = "\n".join(body) + "\n"
    filename = _generated_filename(f"write_fields {cls_name}")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), names)  # noqa: S102 - our own text, one function per class
    fn: Callable[[Any], list[str]] = names["write_fields"]
    return fn


_GENERATED = itertools.count(1)


def _generated_filename(what: str) -> str:
    """A unique pseudo file name for generated source (attrs' convention: `<attrs generated init ...>`)."""
    return f"<kotoba_vllm generated {what} {next(_GENERATED)}>"


def _value_writer(codec: Codec) -> Callable[[Any], "str | None"]:
    if _plain(codec):
        return dumps
    return write_edn if type(codec) is _Nested else codec.write


_SPECS: dict[type, _Spec] = {}


def _frozen(obj: Any) -> bool:
    """An attrs instance that refuses assignment (its text can be written once)."""
    first = attrs.fields(type(obj))[0].name
    try:
        setattr(obj, first, getattr(obj, first))
    except attrs.exceptions.FrozenInstanceError:
        return True
    return False


def class_spec(cls: type) -> _Spec:
    s = _SPECS.get(cls)
    if s is None:
        s = _SPECS[cls] = _Spec(cls)
    return s


def _structure_map(cls: type[T], m: dict[Any, Any], ctx: Ctx, skip: AbstractSet[Keyword] = frozenset()) -> T | None:
    spec = class_spec(cls)
    kwargs: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    before = len(ctx.problems)
    by_id = spec.by_id
    # the view iterates the (one or two) skipped keys; `skip.isdisjoint(dict)` hashed every field key
    skips_fields = bool(skip) and not spec.by_key.keys().isdisjoint(skip)
    for k, v in m.items():
        # the interned field keys by identity first: a Keyword hashes in Python, an id in C
        entry = None if skips_fields else by_id.get(id(k))
        if entry is None:
            if skip and k in skip:
                continue
            if not isinstance(k, Keyword):
                ctx.bad("edn/non-keyword-key", f"map key {describe(k)} must be a keyword", None, m, k)
                continue
            entry = spec.by_key.get(k)
            if entry is None:
                ns = k.namespace
                if spec.extras_attr is not None and ns in spec.extras_ns and (ns != "vllm"
                                                                            or k.name in spec.extras_known):
                    if v is not None:  # nil means absent
                        extras[k.name] = v
                else:
                    ctx.bad("request/unknown-key", f"unknown key {k} in {cls.__name__}", k.name, m, k)
                continue
        if v is None:
            continue  # nil means absent
        name, codec, field = entry
        try:
            kwargs[name] = codec.from_edn(v, ctx, field)
        except _Bad as e:
            if e.msg:
                ctx.bad("request/type", f"{k}: {e.msg}", field, m, k)
    for name in spec.required:
        if name in kwargs:
            continue
        key = next(k for n, k, _ in spec.fields if n == name)
        # a present-but-wrong value already has its problem; do not also call it missing
        if not any(p.field == key.name for p in ctx.problems[before:]):
            ctx.bad("request/missing-key", f"{cls.__name__} needs {key}", key.name, m, None)
    if len(ctx.problems) > before:
        return None
    if spec.extras_attr is not None:
        kwargs[spec.extras_attr] = extras
    return cls(**kwargs)


def _unstructure(obj: object) -> dict[Keyword, Edn]:
    spec = class_spec(type(obj))
    out: dict[Keyword, Edn] = {}
    for name, k, codec in spec.fields:
        v = getattr(obj, name)
        if v is not None:
            v = codec.to_edn(v)
        if v is not None or name in spec.always:
            out[k] = v
    if spec.extras_attr is not None:
        for name, v in getattr(obj, spec.extras_attr).items():
            out[kw(name)] = v
    return out


def _nil_text(s: str | None) -> str:
    return "nil" if s is None else s


def write_fields(obj: object, skip: AbstractSet[Keyword] = frozenset()) -> list[str]:
    """`dumps(to_edn(obj))`'s "key value" entries, in order, without building the maps; keys in
    `skip` are left out. Byte-identical to the generic path (tests/test_edn_writer.py)."""
    spec = _SPECS[type(obj)] if type(obj) in _REGISTERED else None
    if spec is None:
        return _entries_of(edn_converter.unstructure(obj), skip)
    extras = getattr(obj, spec.extras_attr) if spec.extras_attr is not None else None
    if extras and not spec.field_names.isdisjoint(extras):  # an extra replaces a field: rare
        return _entries_of(_unstructure(obj), skip)
    parts = spec.field_writer(skip)(obj)
    if extras:
        skipped = _skip_names(skip) if skip else None
        keys = _EXTRA_KEYS
        kept = _KEPT_ENTRIES
        for name, x in extras.items():
            if skipped is not None and name in skipped:
                continue
            entry = kept.get(id(x))
            if entry is not None and entry[0] == name:
                parts.append(entry[1])
            else:
                parts.append((keys.get(name) or _extra_key(name)) + dumps(x))
    return parts


# value -> (its extra's name, the entry's "key value" text): an extra a caller puts in many records (a pool's
# member, why and verdict) as the very same object, written once.
_KEPT_ENTRIES: IdentityMemo[object, tuple[str, str]] = IdentityMemo(1024)
_IMMUTABLE = (str, bool, int, InternedKeyword, Keyword, type(None))


def keep_extra_text(name: str, value: object) -> None:
    """Keep the record text of the extra `name` holding `value`, for `write_fields` to reuse whenever that
    very object is that extra again. Immutable values only (a kept text must stay true)."""
    had = _KEPT_ENTRIES.get(id(value))
    if type(value) not in _IMMUTABLE or had is not None and had[0] == name:
        return
    try:
        text = (_EXTRA_KEYS.get(name) or _extra_key(name)) + dumps(value)
    except EdnWriteError:
        return  # no text: the record writer says so when it meets the extra
    _KEPT_ENTRIES.keep(value, (name, text))


# extra name -> its "key " text: a pool writes the same four extras into every record
_EXTRA_KEYS: BoundedMemo[str, str] = BoundedMemo(4096)  # names come from servers' answers too
_SKIP_NAMES: BoundedMemo[frozenset[Keyword], frozenset[str]] = BoundedMemo(64)  # a record's skipped keys' names


def _extra_key(name: str) -> str:
    return _EXTRA_KEYS.keep(name, dumps(kw(name)) + " ")  # raises for a name no reader reads back: nothing kept


def _skip_names(skip: AbstractSet[Keyword]) -> frozenset[str]:
    key = skip if isinstance(skip, frozenset) else frozenset(skip)
    names = _SKIP_NAMES.get(key)
    if names is None:  # a batch skips one or two sets of head keys
        names = _SKIP_NAMES.keep(key, frozenset(k.name for k in key))
    return names


def _entries_of(m: dict[Keyword, Edn], skip: AbstractSet[Keyword]) -> list[str]:
    return [dumps(k) + " " + dumps(x) for k, x in m.items() if k not in skip]


def write_edn(obj: object) -> str:
    """Compact EDN text of a typed value: exactly `dumps(to_edn(obj))`, faster for registered classes."""
    if type(obj) not in _REGISTERED:
        return dumps(edn_converter.unstructure(obj))
    return "{" + " ".join(write_fields(obj)) + "}"


_REGISTERED: set[type] = set()  # classes whose EDN is `_unstructure` (register below)


def register(cls: type[T]) -> type[T]:
    """Class decorator: register EDN hooks for an attrs class on `edn_converter`."""
    class_spec(cls)
    _REGISTERED.add(cls)
    edn_converter.register_unstructure_hook(cls, _unstructure)

    def structure(m: object, _: type) -> object:
        ctx = Ctx()
        if not isinstance(m, dict):
            raise StructureError([Problem("error", "request/type", f"expected a map, got {describe(m)}")])
        out = _structure_map(cls, m, ctx)
        if out is None:
            raise StructureError(ctx.problems)
        return out

    edn_converter.register_structure_hook(cls, structure)
    return cls


def structure_located(m: object, cls: type[T], form: Form | None = None,
                      skip: AbstractSet[Keyword] = frozenset()) -> tuple[T | None, list[Problem]]:
    """Structure with problems collected (and located when `form` is given)."""
    ctx = Ctx(form)
    if not isinstance(m, dict):
        ctx.problems.append(Problem("error", "request/type", f"expected a map, got {describe(m)}",
                                    where=form.where if form else None))
        return None, ctx.problems
    return _structure_map(cls, m, ctx, skip), ctx.problems
