"""Providers for tests: scripted outcomes and gates, instead of mocking the seam."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from lading.providers import base

Reply = Callable[[base.Document], base.Outcome]


@dataclasses.dataclass
class ScriptedProvider:
    """Answers each call with `reply(document)`; optionally waits on `gate` first."""

    reply: Reply
    gate: asyncio.Event | None = None
    latency_s: float = 0.0
    calls: list[base.Document] = dataclasses.field(default_factory=list)
    started: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    cancelled: int = 0

    async def extract(self, document: base.Document, *, schema: str, policy: str) -> base.Outcome:
        self.calls.append(document)
        self.started.set()
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return self.reply(document)


def always(outcome: base.Outcome) -> Reply:
    return lambda _document: outcome
