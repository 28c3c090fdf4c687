"""The intent log: what a block's earlier attempts sent and what came back, kept outside the worker.

Ray re-executes a block whose worker died. Before each request goes out its index is appended
(and flushed) to a log file on the output filesystem; when the answer arrives, the finished row
follows it. A later attempt of the same inputs reads every log first:
- an index with a finished row is not sent again; the row is reused as it was;
- an index logged as sent without an answer may already have reached a server: it is sent
  again and its record says `:vllm/maybe-sent-twice true`.

Layout: `DIR/<index // BUCKET>/<attempt>.log`, one file per attempt and bucket, so concurrent
writers never share a file. Lines are JSON: `{"sent": 12}` or `{"done": 12, "row": {...}}`.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import IO, Iterable

BUCKET = 4096


class IntentLog:
    """The log of one attempt at a set of indices."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.attempt = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._files: dict[int, IO[str]] = {}

    def _dir(self, bucket: int) -> str:
        return os.path.join(self.directory, f"{bucket:08d}")

    def earlier(self, indices: Iterable[int]) -> tuple[set[int], dict[int, dict[str, object]]]:
        """(indices sent without an answer, finished rows by index) left by earlier attempts."""
        wanted = set(indices)
        sent: set[int] = set()
        done: dict[int, dict[str, object]] = {}
        for bucket in sorted({i // BUCKET for i in wanted}):
            d = self._dir(bucket)
            try:
                names = os.listdir(d)
            except FileNotFoundError:
                continue
            for name in names:
                if not name.endswith(".log"):
                    continue
                with open(os.path.join(d, name), encoding="utf-8") as fh:
                    for line in fh:
                        if not line.endswith("\n"):
                            break  # torn by the death of its writer
                        rec = json.loads(line)
                        if rec.get("sent") in wanted:
                            sent.add(rec["sent"])
                        elif rec.get("done") in wanted:
                            done[rec["done"]] = rec["row"]
        return sent - done.keys(), done

    def _file(self, index: int) -> IO[str]:
        bucket = index // BUCKET
        fh = self._files.get(bucket)
        if fh is None:
            os.makedirs(self._dir(bucket), exist_ok=True)
            fh = self._files[bucket] = open(os.path.join(self._dir(bucket), self.attempt + ".log"), "a",
                                            encoding="utf-8")
        return fh

    def sent(self, index: int) -> None:
        """Call before the request's first byte goes out."""
        fh = self._file(index)
        fh.write(f'{{"sent": {index}}}\n')
        fh.flush()  # survives the death of this process (not of the machine: no fsync per request)

    def done(self, index: int, row: dict[str, object]) -> None:
        fh = self._file(index)
        fh.write(json.dumps({"done": index, "row": row}, ensure_ascii=False) + "\n")
        fh.flush()

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()
