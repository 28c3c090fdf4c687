"""What a faked engine was handed, written down (used by vllm_fake_engine.py and sglang_fake_scheduler.py).

One JSON line per engine request, appended to the file KOTOBA_FAKE_RECEIVED names; the recorder
(`record --engine-received`) keeps each exchange's lines as its cassette's `:cassette/engine-received`.
"""

from __future__ import annotations

import json
import os
from typing import Any

PATH = os.environ.get("KOTOBA_FAKE_RECEIVED", "")


def plain(v: Any) -> Any:
    """A JSON-able copy: collections as lists and string-keyed dicts, other objects by repr."""
    if isinstance(v, (set, frozenset, tuple, list)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return dict((str(k), plain(x)) for k, x in v.items())
    return v if v is None or isinstance(v, (bool, int, float, str)) else repr(v)


def note(seen: dict[str, Any], sampling: Any, names: tuple[str, ...]) -> None:
    """Append `seen` with the named attributes of the engine's sampling params, when recording."""
    if not PATH:
        return
    seen = dict(seen, sampling_params=None if sampling is None else
                dict((k, plain(getattr(sampling, k, None))) for k in names))
    with open(PATH, "a", encoding="utf-8") as f:
        f.write(json.dumps(seen, sort_keys=True) + "\n")
