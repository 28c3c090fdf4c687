"""`summary.edn` of a `run --ray` (its shape is in schemas/ray.edn)."""

from __future__ import annotations

from typing import Any

from .._edn import kw


def summary_edn(stats: dict[str, Any], *, already_done: int, elapsed_s: float, output: str) -> dict[Any, Any]:
    outcomes = stats["outcomes"]
    return {kw("batch/outcomes"): {kw(k): n for k, n in sorted(outcomes.items())},
            kw("batch/recorded"): stats["rows"], kw("batch/sent"): stats["sent"],
            kw("batch/maybe-sent-twice"): stats["maybe_sent_twice"], kw("batch/already-done"): already_done,
            kw("batch/files"): stats["files"], kw("batch/complete?"): True,
            kw("batch/elapsed-s"): round(elapsed_s, 3),
            kw("batch/records-per-s"): round(stats["rows"] / elapsed_s, 1) if elapsed_s > 0 else None,
            kw("batch/output"): output}
