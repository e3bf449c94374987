"""
Hostile ExtractionBatch specs through the real operator (kopf in its own thread) on the
Kubernetes emulator (the CRD's schema, defaults and CEL rules enforced like the API server),
against real PostgreSQL.

One operator runs for the whole test. Each example creates a batch under a fresh name.
Invariants: the API server refuses it (422 naming the field), or the operator settles its
Admitted condition: True with every document accepted once, or False with a named reason;
never a reconcile error retried for ever; the operator keeps running, and admits a clean batch
after the examples. Run twice: with the CRD enforced, and without it, so that what the API server
would refuse reaches the operator.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import hypothesis
import pytest
from lading_operator import kube

from lading.db import registry
from lading.ids import PoolName
from tests.hostile import strategies, tally
from tests.integration.operator import conftest
from tests.support import kube_emulator, waiting

BATCHES = "lading.dev/v1alpha1/extractionbatches"
REASONS = {"InvalidSpec", "NoTenantQuota", "PoolNotFound", "PoolNotAllowed", "PriorityNotAllowed", "QuotaExceeded",
           "IdempotencyConflict"}  # fmt: skip


def _admitted(obj: dict[str, Any]) -> dict[str, Any]:
    for condition in obj.get("status", {}).get("conditions", []):
        if condition["type"] == "Admitted":
            return dict(condition)
    return {}


@dataclasses.dataclass
class Cluster:
    db: asyncpg.Connection
    api: kube.Client
    emulator: kube_emulator.KubeEmulator
    operator: conftest.OperatorThread
    names: itertools.count[int] = dataclasses.field(default_factory=itertools.count)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # printed with a failing example: keep it short
        printer.text("<Cluster>")

    async def submit(self, spec: dict[str, Any], *, name: str) -> tuple[str, dict[str, Any]]:
        """Create batch `name` with `spec`; how it ended ('admitted', a reason, or refused) and its condition."""
        body = {"apiVersion": conftest.GROUP_VERSION, "kind": "ExtractionBatch",
                "metadata": {"name": name, "namespace": "acme"}, "spec": spec}  # fmt: skip
        try:
            await self.api.create(conftest.batch_path("acme"), body)
        except kube.KubeError as exc:
            tally.check("operator", exc.status == 422, f"the API server answered {exc.status}: {exc}")
            return "refused by the API server", {}
        try:
            settled = await kube_emulator.wait_for(self.emulator, BATCHES, "acme", name,
                                                   lambda o: bool(_admitted(o)), timeout_s=20)  # fmt: skip
        except TimeoutError:
            tally.wedged("operator")
            raise
        condition = _admitted(settled)
        if condition["status"] == "True":
            return "admitted", condition
        return condition["reason"], condition


@pytest.fixture(params=[True, False], ids=["crd-enforced", "crd-bypassed"])
async def emulator(request: pytest.FixtureRequest) -> AsyncIterator[kube_emulator.KubeEmulator]:
    """The emulator enforcing the CRD, and one that does not (an old CRD left installed, a
    validation webhook down): then the operator's own checks are all that stand."""
    async with kube_emulator.serving(validate=request.param) as emulator:
        yield emulator


@pytest.fixture
async def cluster(
        db: asyncpg.Connection, api: kube.Client, emulator: kube_emulator.KubeEmulator,
        operator: conftest.OperatorThread,
) -> AsyncIterator[Cluster]:
    await conftest.create_quota(api, "acme", ["acme"])
    await conftest.create_pool(api, "acme", "builtin")

    async def pool_applied() -> bool:
        return await registry.get_pool(db, name=PoolName("acme/builtin")) is not None

    await waiting.until(pool_applied, timeout_s=20)
    handle = Cluster(db=db, api=api, emulator=emulator, operator=operator)
    yield handle
    how, condition = await handle.submit(conftest.batch_body("acme", "clean", documents=3)["spec"], name="clean")
    assert how == "admitted", condition
    tally.check("operator", handle.operator.thread.is_alive(), "the operator stopped")


@hypothesis.settings(
    max_examples=15, deadline=None, suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)  # fmt: skip
@hypothesis.given(spec=strategies.batch_specs())
async def test_a_batch_is_refused_by_the_api_server_or_admitted_or_pending_with_a_named_reason(
        cluster: Cluster, spec: dict[str, Any],
) -> None:
    tally.tried("custom-resource")
    name = f"hostile-{next(cluster.names)}"
    how, condition = await cluster.submit(spec, name=name)
    tally.ended("custom-resource", how)
    tally.check("operator", cluster.operator.thread.is_alive(), "the operator stopped")
    if how == "admitted":
        jobs = await cluster.db.fetchval(
            "SELECT count(*) FROM extraction_jobs j JOIN batches b ON b.id = j.batch_id WHERE b.name = $1", name
        )
        assert jobs == len(spec["documents"]), "an admitted batch has every document, once"
    elif how != "refused by the API server":
        assert how in REASONS, condition
        assert condition["message"], condition
