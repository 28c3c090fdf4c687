"""The sampling table as data: EDN key -> OpenAI wire name and inclusive bounds.

Adding a knob is one row here (plus a field on `Sampling` and a test). Which engine
honours which knob, and under what wire name, lives in each dialect's table.
"""

from __future__ import annotations

from typing import NamedTuple


class Knob(NamedTuple):
    key: str  # EDN key name, e.g. "vllm/temperature"
    attr: str  # attribute on `Sampling`
    wire: str  # OpenAI-compatible wire name (a dialect may rename it)
    lo: float | None  # inclusive lower bound, None = unbounded
    hi: float | None  # inclusive upper bound


SAMPLING_TABLE: tuple[Knob, ...] = (
    Knob("vllm/temperature", "temperature", "temperature", 0.0, 2.0),
    Knob("vllm/top-p", "top_p", "top_p", 0.0, 1.0),
    Knob("vllm/top-k", "top_k", "top_k", -1, None),
    Knob("vllm/min-p", "min_p", "min_p", 0.0, 1.0),
    Knob("vllm/max-tokens", "max_tokens", "max_tokens", 1, None),
    Knob("vllm/n", "n", "n", 1, None),
    Knob("vllm/best-of", "best_of", "best_of", 1, None),
    Knob("vllm/presence-penalty", "presence_penalty", "presence_penalty", -2.0, 2.0),
    Knob("vllm/frequency-penalty", "frequency_penalty", "frequency_penalty", -2.0, 2.0),
    Knob("vllm/repetition-penalty", "repetition_penalty", "repetition_penalty", 0.0, None),
    Knob("vllm/stop", "stop", "stop", None, None),
    Knob("vllm/seed", "seed", "seed", None, None),
    Knob("vllm/logprobs", "logprobs", "logprobs", 0, None),
    Knob("vllm/guided-json", "guided_json", "guided_json", None, None),
    Knob("vllm/guided-regex", "guided_regex", "guided_regex", None, None),
    Knob("vllm/guided-choice", "guided_choice", "guided_choice", None, None),
)

KNOBS_BY_ATTR: dict[str, Knob] = {k.attr: k for k in SAMPLING_TABLE}
KNOBS_BY_KEY: dict[str, Knob] = {k.key: k for k in SAMPLING_TABLE}
STRUCTURED_ATTRS = ("guided_json", "guided_regex", "guided_choice")
