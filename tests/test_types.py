"""What a user's type checker sees. mypy (strict, settings in pyproject.toml) runs over the whole
package and tests/typing/send_types.py: no errors anywhere, and every `reveal_type(...)` in the
snippet reveals what the `# revealed:` comment on its line says (`client.send(ChatRequest(...))`
is a `Response`, `send(TokenizeRequest(...))` a `TokenizeResponse`, the same for `AsyncClient`,
`Pool` and `AsyncPool`). .ci/run also runs mypy on its own. And the package type-checks as a checkout
without the optional `fast` (orjson) and `ray` extras sees it: mypy run over an interpreter whose
site-packages hold everything installed here except those two."""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api", reason="mypy is in the test extra")

ROOT = Path(__file__).resolve().parents[1]
SNIPPET = ROOT / "tests" / "typing" / "send_types.py"
REVEALED = re.compile(r'^(?P<file>[^:]+):(?P<line>\d+): note: Revealed type is "(?P<type>.*)"$')


def expected() -> dict[int, str]:
    out = {}
    for n, line in enumerate(SNIPPET.read_text(encoding="utf-8").splitlines(), 1):
        if "reveal_type(" in line:
            out[n] = line.split("# revealed:", 1)[1].strip()
    return out


# mypy spells out a type alias; this is `Edn`, one level deep.
EDN_SPELLED = ("None | bool | int | float | decimal.Decimal | str | edn_format.Keyword | edn_format.Symbol | "
               "edn_format.Char | datetime.datetime | uuid.UUID | typing.Sequence[...] | typing.AbstractSet[...] | "
               "typing.Mapping[Any, ...]")


def short(t: str) -> str:
    return "Edn" if t == EDN_SPELLED else t


@pytest.fixture(scope="module")
def mypy_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    cache = tmp_path_factory.mktemp("mypy-cache")
    stdout, stderr, _ = mypy_api.run(["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(cache),
                                      str(SNIPPET), str(ROOT / "kotoba_vllm")])
    return stdout + stderr


def test_the_package_type_checks_strictly(mypy_output: str) -> None:
    errors = [line for line in mypy_output.splitlines() if ": error:" in line]
    assert not errors, "mypy --strict:\n" + "\n".join(errors)


@pytest.fixture(scope="module")
def revealed(mypy_output: str) -> dict[int, str]:
    stdout = mypy_output
    out = {}
    for line in stdout.splitlines():
        m = REVEALED.match(line)
        if m:
            out[int(m["line"])] = short(m["type"])
    return out


def test_every_reveal_type_is_what_the_comment_says(revealed: dict[int, str]) -> None:
    want = expected()
    assert len(want) >= 20
    wrong = {n: (w, revealed.get(n)) for n, w in want.items() if revealed.get(n) != w}
    assert not wrong, "\n".join(f"line {n}: expected {w}, mypy revealed {got}" for n, (w, got) in wrong.items())


def test_send_of_a_chat_request_is_a_response_for_every_client_kind(revealed: dict[int, str]) -> None:
    lines = SNIPPET.read_text(encoding="utf-8").splitlines()
    for prefix in ("c.send(chat)", "await c.send(chat)", "p.send(chat)", "await p.send(chat)"):
        hits = [n for n, line in enumerate(lines, 1) if f"reveal_type({prefix})" in line]
        assert hits and all(revealed[n] == "kotoba_vllm._model.Response" for n in hits), prefix


HIDDEN_EXTRAS = ("orjson", "ray")  # the `fast` and `ray` extras' top-level packages


def site_packages_without(hidden: tuple[str, ...], venv: Path) -> Path:
    """A venv (no pip) whose site-packages links every entry of this interpreter's except `hidden`'s."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    target = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True).stdout.strip())
    source = Path(sysconfig.get_paths()["purelib"])
    for entry in source.iterdir():
        top = entry.name.split("-", 1)[0].split(".", 1)[0].lower()
        if top not in hidden:
            (target / entry.name).symlink_to(entry)
    return python


def test_the_package_type_checks_without_the_fast_and_ray_extras(tmp_path: Path) -> None:
    python = site_packages_without(HIDDEN_EXTRAS, tmp_path / "venv")
    probe = tmp_path / "extras_probe.py"  # proves the extras are hidden: an unresolved import is Any
    probe.write_text("import orjson\nimport ray\nreveal_type(orjson.loads)\nreveal_type(ray.init)\n")
    stdout, stderr, _ = mypy_api.run(["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir",
                                      str(tmp_path / "mypy-cache"), "--python-executable", str(python),
                                      str(probe), str(ROOT / "kotoba_vllm")])
    out = stdout + stderr
    assert out.count('Revealed type is "Any"') == 2, out
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert not errors, "mypy --strict without the fast and ray extras:\n" + "\n".join(errors)
