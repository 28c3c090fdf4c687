"""`python -m kotoba_vllm bench`: prefill and decode apart, per endpoint, with the server's own
counters beside ours. Pure stats in `stats`/`metrics`, the run in `runner`, output in `report`."""

from ._metrics import ServerRates, parse_counters, server_rates
from ._runner import BenchConfig, BenchReport, run, run_async
from ._stats import Dist, Sample, Summary, differing_endpoints, dist, summarize

__all__ = ["BenchConfig", "BenchReport", "Dist", "Sample", "ServerRates", "Summary", "differing_endpoints", "dist",
           "parse_counters", "run", "run_async", "server_rates", "summarize"]
