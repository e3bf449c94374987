"""
The receiver's inbox retention: the cleaner deletes answered inbox rows older than the retention
in bounded batches, never a row inside the dedup window (the sender's longest retry span plus the
replay tolerance), never the ledger; a retention below the window is refused with a clear error.
"""

from __future__ import annotations

import argparse

import asyncpg
import pytest
from lading_cli import receiver as receiver_cli
from lading_webhook_receiver import cleaning, metrics, serving, settings

WINDOW_S = settings.dedup_window_s(settings.ReceiverSettings().tolerance_s)


async def _inbox_row(
        db: asyncpg.Connection, delivery_id: str, *, age_s: float, status: str | None = "accepted"
) -> None:
    await db.execute(
        "INSERT INTO erp_inbox (delivery_id, payload_sha256, event_type, adapter, status, reference, received_at)"
        " VALUES ($1, sha256(convert_to($1::text, 'UTF8')), 'extraction.completed.v1', 'ledger', $2, $3,"
        "         clock_timestamp() - make_interval(secs => $4))",
        delivery_id, status, None if status is None else f"LDG-{delivery_id}", age_s,
    )  # fmt: skip


async def test_the_cleaner_deletes_only_rows_past_the_retention_never_inside_the_dedup_window(
        db: asyncpg.Connection, database_url: str
) -> None:
    await serving.migrate(database_url)
    inside = {f"inside-{i}": WINDOW_S - margin for i, margin in enumerate((60.0, 3600.0, 20 * 86_400.0))}
    inside["new"] = 0.0
    past = {f"past-{i}": WINDOW_S + 60.0 + i for i in range(5)}
    for delivery_id, age in {**inside, **past}.items():
        await _inbox_row(db, delivery_id, age_s=age)
    await db.execute("INSERT INTO ledger_invoices (tenant, supplier_identity, invoice_number, supplier_name, currency,"
                     " total, issue_date, document, lading_job_id, delivery_id) VALUES ('t', 'vat:X', '1', 'S', 'EUR',"
                     " 1, '2026-01-01', '{}', '1', 'past-0')")  # fmt: skip
    config = settings.ReceiverSettings(inbox_retention_s=WINDOW_S, cleaner_batch_size=2, cleaner_max_batches=10)
    observe = metrics.ReceiverMetrics()
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    assert pool is not None
    try:
        result = await cleaning.InboxCleaner(pool, config=config, observe=observe).run_once()
        again = await cleaning.InboxCleaner(pool, config=config, observe=observe).run_once()
    finally:
        await pool.close()

    left = {r["delivery_id"] for r in await db.fetch("SELECT delivery_id FROM erp_inbox")}
    assert left == set(inside)  # every row inside the window stays; every row past the retention went
    assert (result.deleted, again.deleted) == (5, 0)  # in three statements of at most 2 rows
    assert result.oldest_age_s is not None and WINDOW_S - 61.0 <= result.oldest_age_s < WINDOW_S
    assert observe.registry.get_sample_value("lading_receiver_cleaner_deleted_total") == 5
    assert observe.registry.get_sample_value("lading_receiver_inbox_oldest_age_seconds") == pytest.approx(
        again.oldest_age_s, abs=5.0
    )
    assert await db.fetchval("SELECT count(*) FROM ledger_invoices") == 1  # the ERP's records stay


async def test_a_row_still_being_claimed_is_not_taken_even_when_old(db: asyncpg.Connection, database_url: str) -> None:
    await serving.migrate(database_url)
    await _inbox_row(db, "unanswered", age_s=WINDOW_S * 2, status=None)
    config = settings.ReceiverSettings(inbox_retention_s=WINDOW_S)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    assert pool is not None
    try:
        result = await cleaning.InboxCleaner(pool, config=config, observe=metrics.ReceiverMetrics()).run_once()
    finally:
        await pool.close()
    assert result.deleted == 0


def test_a_retention_below_the_dedup_window_is_refused_with_the_window_named() -> None:
    with pytest.raises(ValueError, match=r"inbox retention must be at least 720\.083\d* hours \(the dedup window"):
        settings.ReceiverSettings(inbox_retention_s=WINDOW_S - 1)
    settings.ReceiverSettings(inbox_retention_s=WINDOW_S)  # the window itself is allowed
    # A wider replay tolerance widens the window with it.
    with pytest.raises(ValueError, match="inbox retention"):
        settings.ReceiverSettings(tolerance_s=3600, inbox_retention_s=WINDOW_S)
    assert settings.ReceiverSettings().inbox_retention_s >= WINDOW_S  # the default is inside the bound


def test_lading_receiver_refuses_a_retention_below_the_window_before_serving() -> None:
    parser = argparse.ArgumentParser()
    receiver_cli.add_arguments(parser)
    args = parser.parse_args(["--database-url", "postgresql://127.0.0.1:1/none", "--retain-inbox-hours", "24",
                              "--secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])  # fmt: skip
    assert args.retain_inbox_hours == 24
    with pytest.raises(SystemExit, match=r"lading receiver: inbox retention must be at least 720\.08.* got 24 hours"):
        receiver_cli.run(args)
    assert parser.parse_args(["--database-url", "x"]).retain_inbox_hours == 45 * 24  # the documented default
