"""A deterministic stand-in for vLLM's GPU engine core (runs inside vLLM's own API server process).

Replaces only what `EngineCoreClient.make_async_mp_client` returns. Everything a client reads —
HTTP status, bodies, error and admission messages, detokenized text, stop strings, n>1 fan-out,
tool-call and reasoning parsing, Prometheus metrics — is written by vLLM's code from what this
returns: token ids, finish reasons, engine events, and scheduler stats. It holds no text.

What it answers (scheduled in one step, then one token per step, a fixed step interval):
- chat: the token ids of the last user turn (between the `user` marker id and the turn-end id),
  then EOS; completion (no marker in the prompt): the prompt's own ids, then EOS. Past max_tokens:
  finish LENGTH.
- logprobs when asked: the sampled id at -0.25 (rank 1), then the next ids at -1.5, -2.5, ...
- `ignore_eos`, and `min_tokens` past the answer: the answer repeats instead of ending in EOS (vLLM's
  stop check runs in the engine core, so the fake keeps it); `logit_bias` is not applied (no sampler).
- scheduler stats every step: running (at most max_num_seqs), waiting, KV usage.
Modes, from the environment (set by scripts/record-vllm):
- KOTOBA_FAKE_ECHO_SPAN="user_id,turn_end_id", KOTOBA_FAKE_EOS=id: the ids above.
- KOTOBA_FAKE_HOLD_S=seconds: every request stays in prefill that long (the queue fills).
- KOTOBA_FAKE_DIE_AFTER=n: after n tokens of the first request the engine core dies
  (vLLM's own EngineDeadError, as when a real engine process crashes).
- KOTOBA_FAKE_RECEIVED=path: one JSON line per request, what vLLM's serving layer handed the engine
  (request id, prompt length, priority, cache salt, sampling params); the recorder keeps each
  exchange's lines in its cassette.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np

from vllm.v1.engine import (EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, EngineCoreOutputs,
                            EngineCoreRequest, FinishReason)
from vllm.v1.engine.core_client import EngineCoreClient
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.metrics.stats import PrefillStats, SchedulerStats
from vllm.v1.outputs import LogprobsLists

import engine_received

STEP_S = float(os.environ.get("KOTOBA_FAKE_STEP_S", "0.005"))
# The SamplingParams attributes written down per request.
SAMPLING_SEEN = ("n", "temperature", "seed", "max_tokens", "min_tokens", "ignore_eos", "logit_bias", "stop",
                 "stop_token_ids", "logprobs", "skip_special_tokens", "extra_args")


def _ids(name: str) -> list[int]:
    v = os.environ.get(name, "")
    return [int(x) for x in v.split(",") if x.strip()]


class _Req:
    def __init__(self, r: EngineCoreRequest, now: float) -> None:
        self.id = r.request_id
        self.prompt = list(r.prompt_token_ids or ())
        sp = r.sampling_params
        self.max_tokens = (sp.max_tokens if sp is not None and sp.max_tokens is not None else 1 << 30)
        self.logprobs = sp.logprobs if sp is not None else None
        self.answer = answer_ids(self.prompt)
        ignore_eos = bool(sp is not None and sp.ignore_eos)
        floor = self.max_tokens if ignore_eos else (sp.min_tokens if sp is not None else 0)
        if (ignore_eos or floor > len(self.answer)) and len(self.answer) > 1:  # no EOS yet: say the turn again
            said = self.answer[:-1]
            self.answer = [said[i % len(said)] for i in range(min(floor, 1 << 16))] + self.answer[-1:]
        self.sent = 0
        self.arrived = now
        self.scheduled = False
        self.events = [EngineCoreEvent.new_event(EngineCoreEventType.QUEUED, now)]


def answer_ids(prompt: list[int]) -> list[int]:
    """The last user turn's ids (chat), or the prompt itself (completion), then EOS."""
    span, eos = _ids("KOTOBA_FAKE_ECHO_SPAN"), _ids("KOTOBA_FAKE_EOS")
    out = prompt
    if len(span) == 2 and span[0] in prompt:
        start = len(prompt) - 1 - prompt[::-1].index(span[0]) + 1
        end = prompt.index(span[1], start) if span[1] in prompt[start:] else len(prompt)
        out = prompt[start:end]
    return list(out) + eos[:1]


def note_received(r: EngineCoreRequest) -> None:
    """Write down what the serving layer handed the engine for `r` (KOTOBA_FAKE_RECEIVED)."""
    engine_received.note(dict(request_id=r.request_id, external_req_id=getattr(r, "external_req_id", None),
                              prompt_tokens=len(r.prompt_token_ids or ()), priority=r.priority,
                              cache_salt=getattr(r, "cache_salt", None)), r.sampling_params, SAMPLING_SEEN)


class FakeEngineCore(EngineCoreClient):
    """The async engine-core client AsyncLLM talks to, answering from this process."""

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        self.vllm_config = vllm_config
        sched = vllm_config.scheduler_config
        self.max_running = int(getattr(sched, "max_num_seqs", None) or 256)
        cache = vllm_config.cache_config
        cache.num_gpu_blocks = cache.num_gpu_blocks or 1024
        self.kv_tokens = cache.num_gpu_blocks * (cache.block_size or 16)
        self.vocab = int(vllm_config.model_config.get_vocab_size())
        self.hold_s = float(os.environ.get("KOTOBA_FAKE_HOLD_S", "0"))
        self.die_after = int(os.environ.get("KOTOBA_FAKE_DIE_AFTER", "0"))
        self.engine_ranks_managed = [0]
        self.reqs: dict[str, _Req] = {}
        self.wake = asyncio.Event()
        self.dead = False
        self.idle_stats_sent = True

        class _Resources:
            engine_dead = False

        self.resources = _Resources()

    # ---------------------------------------------------------------- the calls AsyncLLM makes

    async def get_supported_tasks_async(self) -> tuple[str, ...]:
        return ("generate",)

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        note_received(request)
        self.reqs[request.request_id] = _Req(request, time.monotonic())
        self.idle_stats_sent = False
        self.wake.set()

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.reqs.pop(rid, None)
        self.wake.set()

    async def get_output_async(self) -> EngineCoreOutputs:
        while not self.reqs and self.idle_stats_sent:
            self.wake.clear()
            await self.wake.wait()
        await asyncio.sleep(STEP_S)
        if self.dead:
            self.resources.engine_dead = True
            raise EngineDeadError()
        now = time.monotonic()
        outputs: list[EngineCoreOutput] = []
        order = list(self.reqs.values())
        running = order[: self.max_running]
        for r in running:
            if not r.scheduled:  # scheduled this step; its prefill yields the first token next step
                r.scheduled = True
                r.events.append(EngineCoreEvent.new_event(EngineCoreEventType.SCHEDULED, now))
                continue
            if now - r.arrived < self.hold_s:
                continue
            outputs.append(self._step(r, now))
        for o in outputs:
            if o.finish_reason is not None:
                self.reqs.pop(o.request_id, None)
        if self.die_after and any(r.sent >= self.die_after for r in self.reqs.values()):
            self.dead = True  # the next call raises, as a crashed engine process would surface
        used = sum(len(r.prompt) + r.sent for r in self.reqs.values())
        stats = SchedulerStats(num_running_reqs=min(len(self.reqs), self.max_running),
                               num_waiting_reqs=max(0, len(self.reqs) - self.max_running),
                               kv_cache_usage=min(1.0, used / self.kv_tokens))
        if not self.reqs:
            self.idle_stats_sent = True
        return EngineCoreOutputs(outputs=outputs, scheduler_stats=stats, timestamp=now)

    def _step(self, r: _Req, now: float) -> EngineCoreOutput:
        first = r.sent == 0
        tok = r.answer[min(r.sent, len(r.answer) - 1)]
        r.sent += 1
        finish = None
        if r.sent >= len(r.answer):
            finish = FinishReason.STOP
        elif r.sent >= r.max_tokens:
            finish = FinishReason.LENGTH
        lp = None
        if r.logprobs is not None:
            k = max(0, int(r.logprobs))
            alts = [(tok + i) % self.vocab for i in range(1, k + 1)]
            lp = LogprobsLists(np.array([[tok] + alts], dtype=np.int64),
                               np.array([[-0.25] + [-1.5 - i for i in range(k)]], dtype=np.float32),
                               np.array([1], dtype=np.int64))
        events, r.events = (r.events or None), []
        prefill = PrefillStats(num_prompt_tokens=len(r.prompt), num_computed_tokens=len(r.prompt)) if first else None
        return EngineCoreOutput(request_id=r.id, new_token_ids=[tok], new_logprobs=lp, finish_reason=finish,
                                events=events, prefill_stats=prefill)

    # ---------------------------------------------------------------- the rest of the interface

    async def reset_mm_cache_async(self) -> None:
        return None

    async def reset_prefix_cache_async(self, *args: Any, **kwargs: Any) -> bool:
        return True

    async def reset_encoder_cache_async(self) -> None:
        return None

    async def is_sleeping_async(self) -> bool:
        return False

    async def profile_async(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def list_loras_async(self) -> set[int]:
        return set()

    def dp_engines_running(self) -> bool:
        return bool(self.reqs)

    def shutdown(self, timeout: float | None = None) -> None:
        self.reqs.clear()


def install() -> None:
    """Swap vLLM's engine-core process for the fake: the only thing replaced."""
    def make_async_mp_client(vllm_config: Any, *args: Any, **kwargs: Any) -> FakeEngineCore:
        return FakeEngineCore(vllm_config)

    EngineCoreClient.make_async_mp_client = staticmethod(make_async_mp_client)  # type: ignore[assignment]
