"""A deterministic stand-in for SGLang 0.5.23's scheduler process, for recording cassettes on a CPU.

Runs inside the heavy venv built by `scripts/record-sglang` (never in the default test run).
`launch_server(server_args, run_scheduler_process_func=run_fake_scheduler)` starts it in place of
SGLang's `run_scheduler_process`; everything a client reads is then written by SGLang's own code:
http_server, the OpenAI serving classes, TokenizerManager and DetokenizerManager. This process
only replaces the model: it speaks SGLang's ZMQ/io_struct messages, "generates" a fixed token
pattern (one token per step, a short sleep per step), and times each request with SGLang's own
`SchedulerReqTimeStats`. Admission is SGLang's too: a request that finds the waiting queue at
`--max-queued-requests` goes through `Scheduler._abort_on_queued_limit` unchanged. Finish reasons
are SGLang's `FINISH_LENGTH` / `FINISH_MATCHED_TOKEN`; scheduler gauges go through SGLang's
`SchedulerMetricsCollector`. This file holds no response body and no error text.

`ignore_eos` and `min_new_tokens` are kept (the fake model says its pattern again instead of EOS:
SGLang checks both scheduler-side); `logit_bias` is not applied (no sampler). Priorities go through
SGLang's own `Scheduler._set_or_validate_priority`; `/flush_cache` through SGLang's own
`SchedulerFlushWrapper`, flushing (no pools here) only when no request runs or waits, as
`Scheduler.flush_cache` does. With `--enable-lora`, `/load_lora_adapter` and `/unload_lora_adapter`
reach SGLang's own `LoRAManager` (built without its `__init__`: no base model, no LoRA kernels), whose
`_load_lora_adapter` reads the adapter's `adapter_config.json` and safetensors weights from disk and runs its
own `validate_new_adapter` (a name already loaded, DoRA, added tokens, and the fit to `--max-lora-rank` /
`--lora-target-modules` through SGLang's own `LoRAMemoryPool.can_support` on a pool shell with no GPU
buffers), and whose `_unload_lora_adapter` answers with its own `LoRAUpdateOutput`. With KOTOBA_FAKE_RECEIVED=path, one JSON line per
request: what SGLang's TokenizerManager handed the scheduler (rid, prompt length, priority, cache
salt, sampling params), which the recorder keeps in the exchange's cassette.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import zmq

import engine_received

# The words the fake model says, in order; repeats on purpose (an incremental stream then carries
# the same delta twice in a row, which a client must not take for a cumulative one).
OUTPUT_WORDS = " one one two one two three one two three four one two"
PREFILL_S = 0.03  # one prefill forward
STEP_S = 0.02  # one decode step
# The SamplingParams attributes written down per request.
SAMPLING_SEEN = ("n", "temperature", "max_new_tokens", "min_new_tokens", "ignore_eos", "logit_bias", "stop_strs",
                 "stop_token_ids", "skip_special_tokens", "custom_params")


@dataclass
class FakeReq:
    """The fields of SGLang's `Req` that its own admission and output code read."""

    rid: str
    http_worker_ipc: Any
    input_ids: list[int]
    max_new_tokens: int
    ignore_eos: bool
    min_new_tokens: int
    stream: bool
    skip_special_tokens: bool
    spaces_between_special_tokens: bool
    no_stop_trim: bool
    time_stats: Any
    priority: Any = None
    output_ids: list[int] = field(default_factory=list)
    weight_version_events: list[Any] = field(default_factory=list)
    sent_ids: int = 0
    finished_reason: Any = None


def note_received(msg: Any) -> None:
    """Write down what the TokenizerManager handed this process for one request (KOTOBA_FAKE_RECEIVED)."""
    engine_received.note(dict(rid=msg.rid, prompt_tokens=len(msg.input_ids or ()), priority=msg.priority,
                              cache_salt=getattr(msg, "cache_salt", None), extra_key=getattr(msg, "extra_key", None),
                              lora_id=getattr(msg, "lora_id", None),
                              stream=bool(msg.stream)), msg.sampling_params, SAMPLING_SEEN)


def run_fake_scheduler(server_args: Any, port_args: Any, gpu_id: int, tp_rank: int, pp_rank: int,
                       dp_rank: Any, pipe_writer: Any, *_: Any, **__: Any) -> None:
    from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank

    publish(server_args, role="scheduler",
            ranks=SpawnRanks(world_rank=spawn_world_rank(server_args, tp_rank=tp_rank, pp_rank=pp_rank),
                             dp_rank=dp_rank, gpu_id=gpu_id))
    FakeScheduler(server_args, port_args).serve(pipe_writer)


class FakeScheduler:
    def __init__(self, server_args: Any, port_args: Any) -> None:
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.managers.scheduler_components.ipc_channels import SchedulerIpcChannels
        from transformers import AutoTokenizer

        self.server_args = server_args
        self.channels = SchedulerIpcChannels.create(
            port_args=port_args, is_rank_zero=True, skip_tokenizer_init=False,
            metrics_enabled=bool(server_args.enable_metrics), enable_scripted_runtime=False)
        tok = AutoTokenizer.from_pretrained(server_args.tokenizer_path or server_args.model_path)
        self.pattern = tok.encode(OUTPUT_WORDS, add_special_tokens=False)
        self.eos = tok.eos_token_id
        self.context_len = int(server_args.context_length or tok.model_max_length)
        self.max_running = int(server_args.max_running_requests or 8)
        self.waiting: deque[FakeReq] = deque()
        self.running: list[FakeReq] = []
        self.started = time.perf_counter()
        self.metrics = self._metrics_collector() if server_args.enable_metrics else None
        # SGLang's own Scheduler, without its __init__ (no model, no KV pool): just the state its
        # admission path reads, so `_abort_on_queued_limit` and `send_abort_output` run unchanged.
        shell = Scheduler.__new__(Scheduler)
        shell.max_queued_requests = server_args.max_queued_requests
        shell.waiting_queue = self.waiting
        shell.enable_priority_scheduling = bool(getattr(server_args, "enable_priority_scheduling", False))
        shell.schedule_low_priority_values_first = bool(
            getattr(server_args, "schedule_low_priority_values_first", False))
        shell.abort_on_priority_when_disabled = bool(server_args.abort_on_priority_when_disabled)
        shell.rust_server = None
        shell.ipc_channels = self.channels
        shell.enable_hierarchical_cache = False
        shell.page_size = 1
        self.admission = shell
        from sglang.srt.managers.scheduler_components.flush_wrapper import SchedulerFlushWrapper
        # Scheduler.flush_cache's own rule: flush (here: nothing to free) only when fully idle.
        self.flush = SchedulerFlushWrapper(flush_cache=self._idle, is_fully_idle=self._idle,
                                           send_output=self.channels.send_to_tokenizer.send_output)
        self.lora = self._lora_manager() if server_args.enable_lora else None

    def _lora_manager(self) -> Any:
        """SGLang's own LoRAManager holding just the state its adapter load / unload path reads, and its
        own LoRAMemoryPool holding just the shape (rank, target modules) its `can_support` reads: no slot."""
        import torch
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.lora.lora_manager import LoRAManager
        from sglang.srt.lora.mem_pool import LoRAMemoryPool
        from transformers import AutoConfig

        args = self.server_args
        lora = LoRAManager.__new__(LoRAManager)
        lora.base_hf_config = AutoConfig.from_pretrained(args.model_path)
        lora.load_config = LoadConfig()
        lora.lora_backend, lora.base_model, lora.device = None, None, torch.device("cpu")
        lora.attn_dp_enabled, lora.speculative_algorithm = False, None
        lora.max_loras_per_batch = int(args.max_loras_per_batch)
        lora.pending_lora_load_events, lora.lora_added_tokens_size = {}, None
        LoRAManager.init_lora_adapters(lora, None)
        LoRAManager.init_lora_shapes(lora, max_lora_rank=args.max_lora_rank,
                                     target_modules=set(args.lora_target_modules or ()))
        pool = LoRAMemoryPool.__new__(LoRAMemoryPool)
        pool.max_lora_rank, pool.target_modules = lora.max_lora_rank, lora.target_modules
        pool.lora_added_tokens_size, pool.uid_to_buffer_id = lora.lora_added_tokens_size, {}
        lora.memory_pool = pool
        return lora

    def _lora_update(self, msg: Any) -> None:
        from sglang.srt.lora.lora_manager import LoRAManager
        from sglang.srt.managers import io_struct as io
        if self.lora is None:  # SGLang's tokenizer manager refuses before sending when LoRA is off
            return
        step = LoRAManager._load_lora_adapter if isinstance(msg, io.LoadLoRAAdapterReqInput) \
            else LoRAManager._unload_lora_adapter
        self.channels.send_to_tokenizer.send_output(step(self.lora, msg.to_ref()), msg)

    def _idle(self) -> bool:
        return not self.running and not self.waiting

    def _metrics_collector(self) -> Any:
        from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector
        labels = {"model_name": self.server_args.served_model_name or self.server_args.model_path,
                  "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        try:
            return SchedulerMetricsCollector(labels=labels, server_args=self.server_args)
        except (TypeError, ValueError):  # label set differs: let the collector say which it wants
            labels = {"model_name": labels["model_name"], "engine_type": "unified", "tp_rank": "0",
                      "pp_rank": "0"}
            return SchedulerMetricsCollector(labels=labels, server_args=self.server_args)

    # ------------------------------------------------------------------ the loop

    def serve(self, pipe_writer: Any) -> None:
        from sglang.srt.observability.startup_time import build_scheduler_startup_time
        self.startup_time = build_scheduler_startup_time(
            target_load_weight=0.0, draft_load_weight=0.0, kv_cache_allocation=0.0,
            scheduler_e2e=time.perf_counter() - self.started, target_cuda_graph=None, draft_cuda_graph=None)
        pipe_writer.send({"status": "ready", "max_total_num_tokens": self.context_len * self.max_running,
                          "max_req_input_len": self.context_len - 5, "startup_time": self.startup_time,
                          "hicache_object_layout": type(self.admission)._hicache_l3_layout(self.admission)})
        sock = self.channels.recv_from_tokenizer
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        while True:
            busy = bool(self.running or self.waiting)
            if poller.poll(timeout=0 if busy else 50):
                self._drain(sock)
            if self.running or self.waiting:
                self._step()
            self.flush.check_pending()
            self._log_stats()

    def _drain(self, sock: Any) -> None:
        from sglang.srt.managers.io_struct import sock_recv
        while True:
            try:
                msg = sock_recv(sock, zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            self._dispatch(msg)

    def _dispatch(self, msg: Any) -> None:
        from sglang.srt.managers import io_struct as io
        if isinstance(msg, io.TokenizedGenerateReqInput):
            self._admit(msg)
        elif isinstance(msg, io.BatchTokenizedGenerateReqInput):
            for one in msg:
                self._admit(one)
        elif isinstance(msg, io.TokenizedEmbeddingReqInput):
            self._score(msg)
        elif isinstance(msg, io.BatchTokenizedEmbeddingReqInput):
            for one in msg:
                self._score(one)
        elif isinstance(msg, io.AbortReq):
            self._drop(msg)
        elif isinstance(msg, io.GetInternalStateReq):
            from sglang.srt.runtime_context import get_context
            from sglang.srt.utils.common import msgspec_to_builtins  # type: ignore[attr-defined]
            state = dict(get_context().resolved_server_args_dict())
            state.update(startup_time=self.startup_time, effective_max_running_requests_per_dp=self.max_running,
                         last_gen_throughput=0.0)
            state.pop("custom_sigquit_handler", None)
            out = io.GetInternalStateReqOutput(internal_state=msgspec_to_builtins(state))
            self.channels.send_to_tokenizer.send_output(out, msg)
        elif isinstance(msg, io.FlushCacheReqInput):  # through SGLang's own SchedulerFlushWrapper
            out = self.flush.handle(msg)
            if out is not None:
                self.channels.send_to_tokenizer.send_output(out, msg)
        elif isinstance(msg, (io.LoadLoRAAdapterReqInput, io.UnloadLoRAAdapterReqInput)):
            self._lora_update(msg)
        # other control messages (weights, profiling, sessions) have no model to act on here

    def _score(self, msg: Any) -> None:
        """The fake cross-encoder (a server started with --is-embedding): one score per (query, document)
        pair, the share of its token ids that occur more than once (overlap, with no weights behind it)."""
        from sglang.srt.managers.io_struct import BatchEmbeddingOutput, unwrap_from_pickle, wrap_as_pickle
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH
        from sglang.srt.observability.req_time_stats import SchedulerReqTimeStats
        ids = list(msg.input_ids or ())
        stats = SchedulerReqTimeStats.new_from_obj(unwrap_from_pickle(msg.time_stats))
        stats.set_scheduler_recv_time()
        stats.set_forward_entry_time()
        time.sleep(PREFILL_S)
        stats.set_prefill_finished_time()
        stats.set_completion_time()
        out = BatchEmbeddingOutput(
            rids=[msg.rid], http_worker_ipcs=[msg.http_worker_ipc],
            finished_reasons=[FINISH_LENGTH(length=0).to_json()],
            embeddings=[round((len(ids) - len(set(ids))) / max(1, len(ids)), 4)], prompt_tokens=[len(ids)],
            cached_tokens=[0], placeholder_tokens_idx=None, placeholder_tokens_val=None, retraction_counts=[0],
            time_stats=wrap_as_pickle([stats]))
        self.channels.send_to_detokenizer.send_output(out, msg)

    def _admit(self, msg: Any) -> None:
        from sglang.srt.managers.io_struct import unwrap_from_pickle
        from sglang.srt.observability.req_time_stats import SchedulerReqTimeStats
        sp = msg.sampling_params
        note_received(msg)
        stats = SchedulerReqTimeStats.new_from_obj(unwrap_from_pickle(msg.time_stats))
        if self.metrics is not None:
            stats.set_metrics_collector(self.metrics)
        stats.set_scheduler_recv_time()
        req = FakeReq(rid=msg.rid, http_worker_ipc=msg.http_worker_ipc, input_ids=list(msg.input_ids or ()),
                      max_new_tokens=int(sp.max_new_tokens if sp.max_new_tokens is not None else 128),
                      ignore_eos=bool(sp.ignore_eos), min_new_tokens=int(sp.min_new_tokens or 0),
                      stream=bool(msg.stream),
                      skip_special_tokens=bool(sp.skip_special_tokens),
                      spaces_between_special_tokens=bool(sp.spaces_between_special_tokens),
                      no_stop_trim=bool(sp.no_stop_trim), time_stats=stats, priority=msg.priority)
        if not type(self.admission)._set_or_validate_priority(self.admission, req):
            return
        if type(self.admission)._abort_on_queued_limit(self.admission, req):
            return
        self.waiting.append(req)
        stats.set_wait_queue_entry_time()

    def _drop(self, msg: Any) -> None:
        for queue in (self.waiting, self.running):
            for req in list(queue):
                if msg.abort_all or req.rid == msg.rid:
                    queue.remove(req)

    # ------------------------------------------------------------------ "the model"

    def _step(self) -> None:
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH, FINISH_MATCHED_TOKEN
        new: list[FakeReq] = []
        while self.waiting and len(self.running) < self.max_running:
            req = self.waiting.popleft()
            req.time_stats.set_forward_entry_time()
            new.append(req)
        if new:
            time.sleep(PREFILL_S)
            for req in new:
                req.time_stats.set_prefill_finished_time()
            self.running.extend(new)
        else:
            time.sleep(STEP_S)
        for req in self.running:
            n = len(req.output_ids)
            if n < len(self.pattern):
                token = self.pattern[n]
            elif req.ignore_eos or self.eos is None or n < req.min_new_tokens:
                token = self.pattern[n % len(self.pattern)]
            else:
                token = self.eos
            req.output_ids.append(token)
            if token == self.eos and not req.ignore_eos:
                req.finished_reason = FINISH_MATCHED_TOKEN(matched=token)
            elif len(req.output_ids) >= req.max_new_tokens:
                req.finished_reason = FINISH_LENGTH(length=req.max_new_tokens)
        self._send([r for r in self.running if r.stream or r.finished_reason is not None])
        self.running = [r for r in self.running if r.finished_reason is None]

    def _send(self, reqs: list[FakeReq]) -> None:
        from sglang.srt.managers.io_struct import BatchTokenIDOutput, wrap_as_pickle
        if not reqs:
            return
        for req in reqs:
            if req.finished_reason is not None:
                req.time_stats.set_completion_time()
        out = BatchTokenIDOutput(
            rids=[r.rid for r in reqs], http_worker_ipcs=[r.http_worker_ipc for r in reqs],
            finished_reasons=[r.finished_reason.to_json() if r.finished_reason else None for r in reqs],
            decoded_texts=["" for _ in reqs],
            # SGLang's incremental detokenization: the prompt tail as context, then the output so far
            decode_ids=[self._decode_ids(r) for r in reqs],
            read_offsets=[min(5, len(r.input_ids)) for r in reqs],
            output_ids=[r.output_ids[r.sent_ids:] for r in reqs],
            skip_special_tokens=[r.skip_special_tokens for r in reqs],
            spaces_between_special_tokens=[r.spaces_between_special_tokens for r in reqs],
            no_stop_trim=[r.no_stop_trim for r in reqs],
            prompt_tokens=[len(r.input_ids) for r in reqs], reasoning_tokens=[0 for _ in reqs],
            completion_tokens=[len(r.output_ids) for r in reqs], cached_tokens=[0 for _ in reqs],
            input_token_logprobs_val=None, input_token_logprobs_idx=None, output_token_logprobs_val=None,
            output_token_logprobs_idx=None, input_top_logprobs_val=None, input_top_logprobs_idx=None,
            output_top_logprobs_val=None, output_top_logprobs_idx=None, input_token_ids_logprobs_val=None,
            input_token_ids_logprobs_idx=None, output_token_ids_logprobs_val=None,
            output_token_ids_logprobs_idx=None, output_token_entropy_val=None, output_token_sampling_mask=None,
            output_hidden_states=None, routed_experts=None, indexer_topk=None, placeholder_tokens_idx=None,
            placeholder_tokens_val=None, retraction_counts=[0 for _ in reqs],
            time_stats=wrap_as_pickle([r.time_stats for r in reqs]))
        for r in reqs:
            r.sent_ids = len(r.output_ids)
        self.channels.send_to_detokenizer.send_output(out, reqs[0])

    def _decode_ids(self, req: FakeReq) -> list[int]:
        # First message: prompt tail + output; afterwards only the ids not sent yet (the detokenizer
        # keeps the rest), as SGLang's own output streamer does.
        if req.sent_ids == 0:
            return req.input_ids[-5:] + req.output_ids if req.input_ids else list(req.output_ids)
        return req.output_ids[req.sent_ids:]

    def _log_stats(self) -> None:
        if self.metrics is None:
            return
        now = time.monotonic()
        if now - getattr(self, "_last_stats", 0.0) < 0.1:
            return
        self._last_stats = now
        from sglang.srt.observability.metrics_collector import QueueCount, SchedulerStats
        stats = SchedulerStats(num_running_reqs=QueueCount.from_reqs(self.running),
                               num_queue_reqs=QueueCount.from_reqs(list(self.waiting)))
        used = sum(len(r.input_ids) + len(r.output_ids) for r in self.running)
        stats.num_used_tokens = used
        stats.token_usage = round(used / float(self.context_len * self.max_running), 4)
        self.metrics.log_stats(stats)

