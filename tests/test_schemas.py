"""`schemas/` is generated from the code; this fails when the two drift apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from kotoba_vllm._edn import read_all
from kotoba_vllm._schema import SCHEMA_DIR, rendered

REGEN = "regenerate with `python -m kotoba_vllm._schema --write` and commit schemas/"
FILES = sorted(rendered())


@pytest.mark.parametrize("rel", FILES)
def test_schema_file_matches_the_code(rel: str) -> None:
    path = SCHEMA_DIR / rel
    assert path.exists(), f"schemas/{rel} is missing; {REGEN}"
    on_disk = path.read_text(encoding="utf-8")
    assert on_disk == rendered()[rel], f"schemas/{rel} differs from the code; {REGEN}"


@pytest.mark.parametrize("rel", FILES)
def test_schema_files_are_readable_edn(rel: str) -> None:
    [value] = read_all((SCHEMA_DIR / rel).read_text(encoding="utf-8"), rel)
    assert isinstance(value, dict) and value


def test_every_engine_has_a_schema_file() -> None:
    from kotoba_vllm.dialects import DIALECTS
    assert {f"engines/{n}.edn" for n in DIALECTS} <= set(FILES)
    assert Path(SCHEMA_DIR, "shapes.edn").exists()
