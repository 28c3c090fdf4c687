"""Every request example runs against a real llama-server: one record per request, each an answer,
except the invalid requests `batch.*` carry on purpose (reported, never sent)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kotoba_vllm import kw, read_forms

ROOT = Path(__file__).resolve().parent.parent
# file -> request ids expected to be refused before sending
EXAMPLES = {"chat.edn": set(), "completion.edn": set(), "streaming.edn": set(), "structured.edn": set(),
            "regex.edn": set(), "tool-call.edn": set(), "batch.edn": {"too-hot"}, "bench-prompts.edn": set()}


@pytest.mark.live
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs_against_a_real_server(name: str, llama_url: str) -> None:
    p = subprocess.run([sys.executable, "-m", "kotoba_vllm", "run", f"examples/{name}", "--base-url", llama_url,
                        "--backend", "llamacpp", "--no-progress"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    records = [f.value for f in read_forms(p.stdout, "stdout") if kw("vllm/request-index") in f.value]
    source = (ROOT / "examples" / name).read_text()
    forms = [f.value for f in read_forms(source, name)]
    n_requests = len(forms[0]) if len(forms) == 1 and isinstance(forms[0], list) else len(forms)
    assert len(records) == n_requests, p.stderr
    refused = {r.get(kw("vllm/request-id")) for r in records if kw("vllm/error") in r}
    assert refused == EXAMPLES[name], p.stdout
    for r in records:
        if kw("vllm/error") not in r:
            assert r[kw("vllm/backend")] == kw("llamacpp")
            assert r[kw("vllm/endpoint-url")].startswith(llama_url)
    assert p.returncode == (1 if EXAMPLES[name] else 0), p.stderr


@pytest.mark.live
def test_guided_choice_example_is_constrained(llama_url: str) -> None:
    """The grammar llama.cpp gets for :vllm/guided-choice really constrains the (random) model."""
    p = subprocess.run([sys.executable, "-m", "kotoba_vllm", "run", "examples/structured.edn", "--base-url",
                        llama_url, "--backend", "llamacpp", "--no-progress"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    first = next(f.value for f in read_forms(p.stdout, "stdout") if f.value.get(kw("vllm/request-id")) == "choice-1")
    assert first[kw("vllm/text")] in ("yes", "no")


@pytest.mark.live
def test_guided_regex_example_is_constrained(llama_url: str) -> None:
    """The grammar translated from each :vllm/guided-regex holds the (random) model to the regex."""
    p = subprocess.run([sys.executable, "-m", "kotoba_vllm", "run", "examples/regex.edn", "--base-url",
                        llama_url, "--backend", "llamacpp", "--no-progress"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    regexes = {f.value[kw("vllm/request-id")]: f.value[kw("vllm/sampling")][kw("vllm/guided-regex")]
               for f in read_forms((ROOT / "examples" / "regex.edn").read_text(), "regex.edn")}
    records = {f.value[kw("vllm/request-id")]: f.value for f in read_forms(p.stdout, "stdout")
               if kw("vllm/request-index") in f.value}
    assert set(records) == set(regexes), p.stderr
    for rid, pattern in regexes.items():
        assert re.fullmatch(pattern, records[rid][kw("vllm/text")]), (rid, records[rid])
