"""
A reviewer's input that PostgreSQL cannot store (NUL, lone surrogates, numbers past 64 bits or
not finite) is refused as review input naming the field, before any SQL runs, and changes nothing.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import asyncpg
import pytest

from lading import reviewing
from lading.db import pool
from tests.integration.test_reviewing import CORRECT, _awaiting_review, _snapshot


def _corrected(path: tuple[str | int, ...], value: object) -> dict[str, Any]:
    corrected = copy.deepcopy(CORRECT)
    target: Any = corrected
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return corrected


CASES = {
    "nul": (_corrected(("supplier", "name"), "Acme\x00 Tools GmbH"),
            "correction.supplier.name: contains U+0000 (NUL)"),
    "surrogate": (_corrected(("lines", 0, "description"), "Widget \ud800"),
                  "correction.lines[0].description: contains a lone surrogate U+D800"),
    "key": (_corrected(("evidence", "total\x00"), "Total 24.00"), "correction.evidence: a key contains U+0000"),
    "bigint": (_corrected(("total",), 2**64), "correction.total: integer out of range"),
    "nan": (_corrected(("subtotal",), math.nan), "correction.subtotal: nan is not a finite number"),
    "infinity": (_corrected(("extra",), [math.inf]), "correction.extra[0]: inf is not a finite number"),
}  # fmt: skip


@pytest.mark.parametrize(("corrected", "named"), CASES.values(), ids=CASES.keys())
async def test_an_unstorable_correction_is_refused_naming_the_field_and_writes_nothing(
        db: asyncpg.Connection, database_url: str, corrected: dict[str, Any], named: str
) -> None:
    [job_id] = await _awaiting_review(db)
    before = await _snapshot(db)

    with pytest.raises(reviewing.CorrectionInvalid) as refused:
        await reviewing.correct(db, job_id=job_id, reviewer="bob", reason="fixed", corrected=corrected)

    assert named in str(refused.value)
    assert "Acme" not in str(refused.value) and "Widget" not in str(refused.value)  # the field, not the value
    assert await _snapshot(db) == before
    assert await db.fetchval("SELECT state FROM extraction_jobs WHERE id = $1", job_id) == "REVIEW_REQUIRED"
    # Before any SQL: a connection that can run none refuses the same way.
    closed = await pool.connect(database_url)
    await closed.close()
    with pytest.raises(reviewing.CorrectionInvalid):
        await reviewing.correct(closed, job_id=job_id, reviewer="bob", reason="fixed", corrected=corrected)


@pytest.mark.parametrize("sign_off", [
    {"reviewer": "bob\ud800", "reason": "fixed"},
    {"reviewer": "bob", "reason": "fixed \udfff"},
], ids=["reviewer", "reason"])  # fmt: skip
async def test_a_sign_off_with_a_lone_surrogate_is_refused_and_writes_nothing(
        db: asyncpg.Connection, sign_off: dict[str, str]
) -> None:
    [job_id] = await _awaiting_review(db)
    before = await _snapshot(db)
    what = "reviewer" if "\ud800" in sign_off["reviewer"] else "reason"
    for decide in (reviewing.approve, reviewing.reject):
        with pytest.raises(reviewing.ReviewInputInvalid, match=f"the {what} contains a lone surrogate"):
            await decide(db, job_id=job_id, **sign_off)
    with pytest.raises(reviewing.ReviewInputInvalid, match=f"the {what} contains a lone surrogate"):
        await reviewing.correct(db, job_id=job_id, corrected=CORRECT, **sign_off)
    assert await _snapshot(db) == before
