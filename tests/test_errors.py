"""One error root: whatever a user gets wrong, what they catch is a `KotobaError` that says
what and where; nothing here reaches a server (port 9 on loopback would refuse anyway)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

import kotoba_vllm
from kotoba_vllm import (CassetteError, Client, ConfigError, EdnError, EdnWriteError, KotobaError, Pool, PromptError,
                         ValidationError, _errors, dumps, kw, read_forms)
from kotoba_vllm.bench._prompts import load_prompts
from kotoba_vllm.cassettes import cassette_from_edn
from kotoba_vllm.pool import pool_config_from_edn

URL = "http://127.0.0.1:9"


def test_a_message_that_is_not_a_message_is_a_kotoba_error() -> None:
    with Client(URL, backend="llamacpp") as c:
        with pytest.raises(KotobaError) as e:
            c.chat([42])
    assert isinstance(e.value, ValidationError)  # refused like a bad EDN message: nothing was sent
    assert "Message" in str(e.value) or "map" in str(e.value)


def test_an_edn_message_of_the_wrong_shape_is_a_kotoba_error() -> None:
    with Client(URL, backend="llamacpp") as c, pytest.raises(KotobaError):
        c.chat([{kw("vllm/role"): 5}])


def test_bad_edn_text_names_file_line_and_column() -> None:
    with pytest.raises(KotobaError) as e:
        list(read_forms('{:a 1}\n{:b "unclosed', "req.edn"))
    err = e.value
    assert isinstance(err, EdnError) and isinstance(err, ValueError)  # `except ValueError` keeps working
    assert str(err).startswith("req.edn:2:")
    assert err.to_edn()[kw("vllm/line")] == 2


def test_a_value_with_no_edn_form_is_a_write_error() -> None:
    with pytest.raises(EdnWriteError) as e:
        dumps(object())
    assert isinstance(e.value, KotobaError) and isinstance(e.value, TypeError)


@pytest.mark.parametrize("make", [
    lambda: Client(URL, backend="nope"),
    lambda: Pool([URL, URL], backend="llamacpp"),
    lambda: pool_config_from_edn({kw("pool/members"): []}),
    lambda: kotoba_vllm.get_dialect("nope"),
], ids=["client-backend", "pool-duplicates", "pool-file", "dialect"])
def test_unusable_configuration_is_a_config_error(make: Callable[[], Any]) -> None:
    with pytest.raises(ConfigError) as e:
        make()
    assert isinstance(e.value, KotobaError) and isinstance(e.value, ValueError)


def test_a_prompt_file_without_prompts_is_a_prompt_error(tmp_path: Path) -> None:
    p = tmp_path / "prompts.edn"
    p.write_text("[]\n")
    with pytest.raises(KotobaError) as e:
        load_prompts(str(p))
    assert isinstance(e.value, PromptError)


def test_a_cassette_without_its_keys_is_a_cassette_error() -> None:
    with pytest.raises(KotobaError) as e:
        cassette_from_edn({kw("cassette/name"): "x"}, "x.edn")
    assert isinstance(e.value, CassetteError) and "x.edn" in str(e.value)


def test_a_request_map_without_keyword_keys_is_a_validation_error() -> None:
    with Client(URL, backend="llamacpp") as c, pytest.raises(ValidationError):
        c.send({"vllm/endpoint": "chat"})  # type: ignore[call-overload]  # wrong on purpose


def test_an_embedding_request_does_not_stream() -> None:
    with Client(URL, backend="vllm") as c, pytest.raises(ValidationError) as e:
        c.stream(kotoba_vllm.EmbeddingRequest(input="hi"))  # type: ignore[arg-type]  # wrong on purpose
    assert "does not stream" in str(e.value)


def test_every_error_has_edn_naming_its_kind() -> None:
    for cls in _errors.ALL_ERRORS:
        assert cls.kind != "error" or cls is KotobaError, f"{cls.__name__} needs its own :vllm/error kind"
    kinds = [cls.kind for cls in _errors.ALL_ERRORS]
    assert len(kinds) == len(set(kinds)), "every error kind is distinct"
