"""The public value types are built by `slot_stores`' `__init__`, not attrs' own: a user must not be able to
tell. Each class is built both ways from the same arguments (positional, keyword, defaults) and compared
field by field; what attrs refuses, this refuses the same way; instances stay frozen, factories fresh."""

from __future__ import annotations

import inspect
import re
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kotoba_vllm._errors import ConfigError
from kotoba_vllm._model import ATTRS_INITS, Figure, Message, Response, StreamDelta, builder, slot_stores, stream_delta
from kotoba_vllm._timings import ServerTimings
from kotoba_vllm.dialects._http import HttpRequest

CLASSES = sorted(ATTRS_INITS, key=lambda c: c.__qualname__)
VALUES = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.booleans(), st.floats(allow_nan=False),
                   st.tuples(st.integers()), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def attrs_built(cls: type, *args: Any, **kwargs: Any) -> Any:
    obj = object.__new__(cls)
    ATTRS_INITS[cls](obj, *args, **kwargs)
    return obj


def fields_of(obj: Any) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in attrs.fields(type(obj)))


def test_every_public_type_and_the_per_request_ones_take_it() -> None:
    assert {Response, Message, Figure, StreamDelta, HttpRequest, ServerTimings} <= set(ATTRS_INITS)
    for cls in CLASSES:
        assert cls.__init__ is not ATTRS_INITS[cls]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__qualname__)
def test_same_signature_as_attrs(cls: type) -> None:
    assert inspect.signature(cls.__init__) == inspect.signature(ATTRS_INITS[cls])
    assert list(inspect.signature(builder(cls)).parameters.values()) == \
        list(inspect.signature(ATTRS_INITS[cls]).parameters.values())[1:]  # all but `self`
    assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_same_instance_as_attrs_from_any_arguments(data: st.DataObject) -> None:
    cls = data.draw(st.sampled_from(CLASSES))
    fields = attrs.fields(cls)
    chosen = data.draw(st.lists(st.booleans(), min_size=len(fields), max_size=len(fields)))
    values = [data.draw(VALUES) for _ in fields]
    positional = data.draw(st.integers(0, len(fields)))
    args, kwargs = [], {}
    for i, (f, use, v) in enumerate(zip(fields, chosen, values)):
        required = f.default is attrs.NOTHING
        if i < positional and (use or required) and len(args) == i:
            args.append(v)
        elif use or required:
            kwargs[f.alias] = v
    theirs = attrs_built(cls, *args, **kwargs)
    for ours in (cls(*args, **kwargs), builder(cls)(*args, **kwargs)):
        assert type(ours) is cls
        assert fields_of(ours) == fields_of(theirs)
        assert ours == theirs and repr(ours) == repr(theirs)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__qualname__)
def test_refuses_what_attrs_refuses(cls: type) -> None:
    n = len(attrs.fields(cls))
    for args, kwargs in (((None,) * (n + 1), {}), ((), {"no_such_field": 1})):
        with pytest.raises(TypeError) as theirs:
            attrs_built(cls, *args, **kwargs)
        with pytest.raises(TypeError) as ours:
            cls(*args, **kwargs)
        assert str(ours.value).split("() ", 1)[1] == str(theirs.value).split("() ", 1)[1]
        with pytest.raises(TypeError) as built:
            builder(cls)(*args, **kwargs)
        mine, attrs_says = str(built.value).split("() ", 1)[1], str(theirs.value).split("() ", 1)[1]
        if args:  # the builder has no `self`: one positional argument fewer in its count
            mine = re.sub(r"\d+", lambda m: str(int(m.group()) + 1), mine)
        assert mine == attrs_says


def test_required_fields_stay_required() -> None:
    for make in (Message, builder(Message)):
        with pytest.raises(TypeError, match="missing 1 required positional argument: 'role'"):
            make()  # type: ignore[call-arg]


def test_stream_delta_is_the_builder() -> None:
    assert stream_delta("He", None, 0) == StreamDelta(delta="He", index=0)
    assert stream_delta is builder(StreamDelta)


def test_instances_stay_frozen_and_factories_fresh() -> None:
    r = Response(text="hi")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        r.text = "other"  # type: ignore[misc]
    assert Response().extras == {} and Response().extras is not Response().extras
    assert attrs.evolve(r, text="there") == Response(text="there")
    assert hash(Figure(tokens=3)) == hash(attrs_built(Figure, tokens=3))


def test_refuses_a_class_it_cannot_build_the_same_way() -> None:
    @attrs.frozen
    class Checked:
        n: int = attrs.field(validator=attrs.validators.instance_of(int))

    @attrs.frozen
    class Hooked:
        n: int = 0

        def __attrs_post_init__(self) -> None:
            pass

    for cls in (Checked, Hooked):
        with pytest.raises(ConfigError, match="slot_stores takes"):
            slot_stores(cls)
