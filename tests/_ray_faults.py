"""Faults for the live Ray test, steered from the test: a conductor actor every request checks in
with, and a RequestStage subclass that can be paused (so a server can be stopped while nothing is
in flight to it) and killed while it holds answers it has received but not yet logged.

The kill is exact on purpose: at the SIGKILL every request the actor had in flight has been
answered by a server (so the server counted it) and none of the answers reached the intent log
(so the re-executed block must send them again and flag them). What each held request got on its
first send is written to `held_file`, so the test can add the servers' first executions back.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

from kotoba_vllm._errors import KotobaError
from kotoba_vllm.batch import BatchEntry
from kotoba_vllm.ray import RequestStage


class Conductor:
    """Counts requests in flight across actors; a closed gate holds new sends; hands out one kill."""

    def __init__(self) -> None:
        self.closed = False
        self.inflight = 0
        self.answers = 0
        self.kill_armed = False
        self.kill_taken = False

    def enter(self) -> bool:
        if self.closed:
            return False
        self.inflight += 1
        return True

    def leave(self) -> bool:
        """True for exactly one caller after `arm_kill`: that actor holds its answers and dies."""
        self.inflight -= 1
        self.answers += 1
        if self.kill_armed and not self.kill_taken:
            self.kill_taken = True
            return True
        return False

    def close(self) -> None:
        self.closed = True

    def reopen(self) -> None:
        self.closed = False

    def state(self) -> tuple[int, int]:
        return self.inflight, self.answers

    def arm_kill(self) -> None:
        self.kill_armed = True

    def killed(self) -> bool:
        return self.kill_taken


class FaultyStage(RequestStage):
    def __init__(self, *, conductor: str, held_file: str, **kwargs: Any) -> None:
        import ray
        super().__init__(**kwargs)
        self.conductor = ray.get_actor(conductor)
        self.held_file = held_file
        self.entered = 0  # sends begun (each already logged as sent) and not finished
        self.holding = False
        self.held: list[dict[str, Any]] = []

    async def send(self, entry: BatchEntry) -> Any:
        self.entered += 1
        while not await self.conductor.enter.remote():
            await asyncio.sleep(0.02)
        outcome: Any = None
        error: KotobaError | None = None
        try:
            outcome = await super().send(entry)
        except KotobaError as e:
            error = e
        doomed = await self.conductor.leave.remote()
        self.holding = self.holding or doomed
        if self.holding:
            usage = getattr(outcome, "usage", None)
            self.held.append({"index": entry.index, "outcome": error.kind if error else "ok",
                              "completion_tokens": (usage.completion_tokens or 0) if usage else 0})
            if len(self.held) == self.entered:  # every request in flight is answered and held
                with open(self.held_file, "w", encoding="utf-8") as fh:
                    json.dump(self.held, fh)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.kill(os.getpid(), signal.SIGKILL)
            await asyncio.Event().wait()  # held until the kill
        self.entered -= 1
        if error is not None:
            raise error
        return outcome
