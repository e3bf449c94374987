"""
Result reuse in the worker: after each claim, one round trip says which claimed jobs take an
earlier accepted result, which wait for a duplicate being extracted, and which call the model
(`lading.db.reuse.resolve`; docs/reuse.md). The claimer runs only the last through the executor;
the others become their Finish here, without a model call, a limiter permit or a document fetch:

    REUSE  -> SUCCEEDED, reused_from = the source job, attempt `reused` with no tokens
    WAIT   -> RETRY_SCHEDULED after a short pause (WaitPolicy), attempt `deferred` and given back
    LEAD   -> the executor calls the model as always

When the resolution cannot be read (the database is unreachable), every job leads: reuse saves
money, it never holds work back.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable, Sequence

import asyncpg

from lading import costing, reuse
from lading.db import jobs
from lading.db import reuse as reuse_db
from lading.ids import JobId, WorkerId
from lading.jobs import transitions
from lading.settings import AttemptSettings

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Reuser:
    producer: reuse.Producer
    worker_id: WorkerId
    attempt: AttemptSettings
    """A job waits for its duplicate only while a whole attempt would still fit before its deadline."""
    wait: reuse.WaitPolicy = dataclasses.field(default_factory=reuse.WaitPolicy)
    rand: Callable[[], float] = random.random

    async def resolve(
            self, conn: asyncpg.Connection, claimed: Sequence[jobs.ClaimedJob]
    ) -> dict[JobId, reuse_db.Decision]:
        """The decision for each of `claimed`; an empty answer (every job leads) when it cannot be read."""
        try:
            return await reuse_db.resolve(
                conn, [(j.id, j.fence) for j in claimed], worker_id=self.worker_id,
                model=self.producer.model, prompt_version=self.producer.prompt_version,
                judging=self.producer.judging,
                wait_margin_s=self.wait.cap_s + self.attempt.timeout_s,
            )  # fmt: skip
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            logger.warning("Could not look up reusable results, %d jobs call the model: %s", len(claimed), exc)
            return {}

    def finish(self, job: jobs.ClaimedJob, decision: reuse_db.Decision) -> transitions.Finish | None:
        """The Finish of a job that does not call the model; None for one that does."""
        if decision.kind is reuse_db.Kind.REUSE and decision.other_job is not None and decision.result is not None:
            if decision.saved_cost is not None and decision.saved_currency is not None:
                costing.count_saved(
                    tenant=job.tenant, pool=job.pool, currency=decision.saved_currency, amount=decision.saved_cost
                )
            return transitions.reused(
                job.id, job.fence, source=decision.other_job, result=decision.result,
                validation=decision.validation or {},
            )  # fmt: skip
        if decision.kind is reuse_db.Kind.WAIT and decision.other_job is not None:
            return transitions.deferred(
                job.id, job.fence, leader=decision.other_job,
                retry_in_s=self.wait.pause_s(decision.waits, rand=self.rand),
            )  # fmt: skip
        return None

