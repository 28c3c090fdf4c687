"""CLI pieces that need no server: render, validate, and --help on every command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kotoba_vllm._edn import kw, read_all
from kotoba_vllm.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
REQUEST_EXAMPLES = ("chat", "completion", "streaming", "structured", "tool-call")  # issue 2's examples


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


# ------------------------------------------------------------------ render


def test_render_json_one_object_per_request_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "render", str(EXAMPLES / "completion.edn"), "--backend", "llamacpp",
                           "--format", "json")
    assert code == 0
    first, second = [json.loads(line) for line in out.splitlines()]
    assert set(first) == {"method", "path", "body", "headers"}
    assert first["headers"] == {"x-request-id": "completion-1"}  # llama.cpp reads a request id from the header
    assert (first["path"], first["body"]["max_tokens"]) == ("/v1/completions", 16)
    assert (second["path"], second["body"]["n_predict"]) == ("/completion", 16)


def test_render_sglang_generate(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "render", str(EXAMPLES / "completion.edn"), "-b", "sglang", "-f", "json")
    native = json.loads(out.splitlines()[1])
    assert code == 0 and native["path"] == "/generate"
    assert native["body"]["sampling_params"]["max_new_tokens"] == 16
    assert native["body"]["sampling_params"]["sampling_seed"] == 7


def test_render_edn_format_is_readable_edn(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "render", str(EXAMPLES / "structured.edn"), "--backend", "vllm")
    assert code == 0
    maps = read_all(out)
    assert [m[kw("http/path")] for m in maps] == ["/v1/chat/completions", "/v1/completions"]
    assert maps[0][kw("http/body")][kw("structured_outputs")] == {kw("choice"): ["yes", "no"]}
    assert all(m[kw("http/method")] == kw("post") for m in maps)


def test_render_refuses_best_of_for_vllm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path, "bo.edn", '{:vllm/endpoint :completion :vllm/prompt "x" '
                                  ':vllm/sampling {:vllm/n 1 :vllm/best-of 3}}')
    code, out, _ = run_cli(capsys, "render", f, "--backend", "vllm")
    assert code == 1
    [rec] = read_all(out)
    [p] = rec[kw("vllm/problems")]
    assert p[kw("vllm/field")] == kw("vllm/best-of") and p[kw("vllm/engine")] == kw("vllm")


def test_render_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io
    monkeypatch.setattr(sys, "stdin", io.StringIO('{:vllm/endpoint :generate :vllm/prompt "p" '
                                                  ':vllm/sampling {:vllm/max-tokens 3}}'))
    code, out, _ = run_cli(capsys, "render", "-", "-b", "llamacpp", "-f", "json")
    assert code == 0 and json.loads(out)["body"] == {"prompt": "p", "n_predict": 3}


# ------------------------------------------------------------------ validate


def test_validate_examples_pass(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(EXAMPLES / f"{n}.edn") for n in REQUEST_EXAMPLES]
    code, out, err = run_cli(capsys, "validate", *files)
    assert code == 0, out + err
    assert out == ""


def test_validate_out_of_range_temperature(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path, "hot.edn", '{:vllm/endpoint :chat\n :vllm/messages [{:vllm/role :user :vllm/content "x"}]\n'
                                   ' :vllm/sampling {:vllm/temperature 2.5}}')
    code, out, _ = run_cli(capsys, "validate", f)
    assert code == 1
    [p] = read_all(out)
    assert p[kw("vllm/code")] == kw("sampling/range") and p[kw("vllm/field")] == kw("vllm/temperature")
    assert p[kw("vllm/severity")] == kw("error") and p[kw("vllm/where")].startswith(f)


def test_validate_unknown_key_is_located(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path, "typo.edn", '{:vllm/endpoint :chat\n :vllm/messages [{:vllm/role :user :vllm/content "x"}]\n'
                                    ' :vllm/temprature 0.5}')
    code, out, _ = run_cli(capsys, "validate", f)
    assert code == 1
    [p] = read_all(out)
    assert p[kw("vllm/code")] == kw("request/unknown-key") and p[kw("vllm/where")] == f"{f}:3:2"


def test_validate_broken_edn_names_file_line_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path, "broken.edn", '{:vllm/endpoint :chat\n :vllm/messages [{:vllm/role :user}\n')
    code, out, err = run_cli(capsys, "validate", f)
    assert code != 0 and out == ""
    assert f"{f}:2:" in err and "never closed" in err


def test_validate_duplicate_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path, "dup.edn", '{:vllm/endpoint :chat :vllm/endpoint :completion}')
    code, _, err = run_cli(capsys, "validate", f)
    assert code != 0 and f"{f}:1:23: duplicate map key :vllm/endpoint" in err


def test_validate_with_backend_adds_engine_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path, "re.edn", '{:vllm/endpoint :chat :vllm/messages [{:vllm/role :user :vllm/content "x"}]'
                                  ' :vllm/sampling {:vllm/guided-regex "(a)\\\\1"}}')  # a back-reference
    assert run_cli(capsys, "validate", f)[0] == 0
    code, out, _ = run_cli(capsys, "validate", f, "--backend", "llamacpp")
    assert code == 1 and read_all(out)[0][kw("vllm/engine")] == kw("llamacpp")


def test_validate_continues_past_a_broken_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path, "bad.edn", "{")
    code, out, err = run_cli(capsys, "validate", bad, str(EXAMPLES / "chat.edn"))
    assert code == 1 and "bad.edn:1:1" in err


def test_missing_file_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "validate", "/nonexistent/x.edn")
    assert code != 0 and "x.edn" in err and "Traceback" not in err


# ------------------------------------------------------------------ help


def _commands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sorted(sub.choices)  # type: ignore[attr-defined]


def test_core_commands_are_registered() -> None:
    assert {"render", "validate", "run"} <= set(_commands())


@pytest.mark.parametrize("command", _commands())
def test_help_on_every_command(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        main([command, "--help"])
    assert ei.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out and command in out


def test_top_level_help_via_python_m() -> None:
    p = subprocess.run([sys.executable, "-m", "kotoba_vllm", "--help"], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert p.returncode == 0 and "render" in p.stdout and "validate" in p.stdout


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2


# ------------------------------------------------------------------ what a Clojure program writes (issue 16)


def test_a_request_clojure_printed_validates_and_renders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path, "from-repl.edn",
              '^{:doc "pr-str from a REPL"}\n#:vllm{:endpoint :chat, :model "m", :messages '
              '[#:vllm{:role :user, :content "smile \\uD83D\\uDE00 \\101"}], :sampling #:vllm{:max-tokens 4}}\n'
              '#:vllm{:endpoint :completion, :model "m", :prompt "lone \\uD83D"}\n')
    code, out, err = run_cli(capsys, "validate", f, "-b", "vllm")
    assert (code, out, err) == (0, "", "")
    code, out, err = run_cli(capsys, "render", f, "-b", "vllm", "-f", "json")
    first, second = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and err == ""
    assert first["body"]["messages"][0]["content"] == "smile \U0001F600 A"  # one character, as in Clojure
    assert second["body"]["prompt"] == "lone \ud83d"  # kept, and printed as JSON's escape


def test_validate_streams_and_still_names_the_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = '{:vllm/endpoint :completion :vllm/model "m" :vllm/prompt "p"}\n'
    f = write(tmp_path, "many.edn", good * 3000 + '{:vllm/endpoint :completion :vllm/prompt "p"\n :vllm/bogus 1}\n'
              + good + "{:broken")
    code, out, err = run_cli(capsys, "validate", f)
    [rec] = read_all(out)
    assert code == 1 and rec[kw("vllm/where")] == f"{f}:3002:2" and rec[kw("vllm/request-index")] == 3000
    assert err.startswith(f"error: {f}:3004:1:")


def test_a_command_loads_only_its_own_module(tmp_path: Path) -> None:
    """`run` no longer pays for importing every other command (Ray planning, benchmarks, recording:
    ~0.1 s, most of a small batch's start-up); `--help` still lists them all."""
    code = ("import sys; from kotoba_vllm.cli import COMMANDS, main; rc = main(['run', sys.argv[1]]); "
            "print(rc, sorted(m for m in COMMANDS.values() if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "absent.edn")], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split(" ", 1)[0] == "2" and "no such file" in r.stderr  # the run itself answered
    assert r.stdout.strip().endswith("['kotoba_vllm.cli.run']"), r.stdout
    help_text = subprocess.run([sys.executable, "-m", "kotoba_vllm", "--help"], capture_output=True, text=True,
                               cwd=ROOT, timeout=120).stdout
    assert all(name in help_text for name in ("render", "validate", "run", "capacity", "plan", "bench"))
