"""A permit whose release failed (the database went away as the attempt finished) is released once
the database answers again, not left to hold the pool's concurrency until it expires."""

from __future__ import annotations

import asyncio
import dataclasses

import asyncpg
from lading_worker import executing

from lading import limiting
from lading.providers import base
from lading.settings import AttemptSettings
from tests.support import providers


@dataclasses.dataclass
class _FlakyLimiter:
    """Refuses the first `failures` releases as a database restart would, then records them."""

    failures: int
    settings: limiting.LimiterSettings = dataclasses.field(default_factory=lambda: limiting.LimiterSettings(
        permit_ttl_s=30.0
    ))
    released: list[tuple[int, int | None]] = dataclasses.field(default_factory=list)
    done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    tries: int = 0

    def counted_tokens(self, permit: limiting.Permit, reservation: limiting.Reservation, **_: object) -> int:
        return reservation.total

    async def release(self, permit: limiting.Permit, *, tokens_used: int | None) -> None:
        self.tries += 1
        if self.tries <= self.failures:
            raise asyncpg.exceptions.CannotConnectNowError("the database system is starting up")
        self.released.append((permit.id, tokens_used))
        self.done.set()


async def test_a_release_refused_by_a_restarting_database_is_retried_until_it_is_done() -> None:
    executor = executing.Executor(
        provider=providers.ScriptedProvider(providers.always(base.Outcome.ok({}))),
        settings=AttemptSettings(timeout_s=10),
    )
    limiter = _FlakyLimiter(failures=3)
    reservation = limiting.Reservation(prompt_tokens=100, output_tokens=50)
    outcome = base.Outcome.ok({})
    settled = await executor._settle(limiter, limiting.Permit(id=7, tokens_reserved=150), reservation, outcome)  # type: ignore[arg-type]
    assert settled is outcome  # the attempt's outcome is committed without waiting for the release
    await asyncio.wait_for(limiter.done.wait(), timeout=30)
    assert limiter.released == [(7, 150)]
    assert limiter.tries == 4
