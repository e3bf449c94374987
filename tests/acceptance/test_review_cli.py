"""`lading review list|show|approve|correct|reject` as a reviewer runs them: a real process against real PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import subprocess
import sys
from typing import Any

import asyncpg
import pytest

from lading import accepting, ids, validation
from lading.db import jobs
from lading.jobs import transitions
from tests.support import factories, processes

pytestmark = pytest.mark.slow

WORKER = ids.WorkerId("w1")
SECRET = "CONFIDENTIAL"

TEXT = f"""{SECRET} INVOICE
Invoice no: INV-7
Date: 2024-05-02
Gadget   3 x 5.00   15.00
Subtotal 15.00
VAT 3.00
Total 18.00
"""

CORRECT: dict[str, Any] = {
    "invoice_number": "INV-7",
    "issue_date": "2024-05-02",
    "currency": "USD",
    "supplier": {"name": "Gadget Works"},
    "buyer": {"name": "Shop Inc"},
    "lines": [{"description": "Gadget", "quantity": "3", "unit_price": "5.00", "amount": "15.00", "tax_rate": "20"}],
    "subtotal": "15.00",
    "tax_total": "3.00",
    "total": "18.00",
    "evidence": {
        "invoice_number": "Invoice no: INV-7",
        "lines[0].amount": "3 x 5.00   15.00",
        "subtotal": "Subtotal 15.00",
        "tax_total": "VAT 3.00",
        "total": "Total 18.00",
    },
}
DOUBTFUL: dict[str, Any] = {**CORRECT, "subtotal": "51.00"}


def _lading(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from lading_cli.main import main; raise SystemExit(main())", *args],
        input=stdin, capture_output=True, text=True, timeout=60, env=processes.environment(), cwd=processes.ROOT,
    )  # fmt: skip


async def _run(database_url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(_lading, "review", *args, "--database-url", database_url, stdin=stdin)


async def _json(database_url: str, *args: str, stdin: str | None = None) -> Any:
    done = await _run(database_url, *args, "--json", stdin=stdin)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def _awaiting_review(db: asyncpg.Connection, *, count: int) -> list[int]:
    await factories.seed(db)
    request = dataclasses.replace(
        factories.batch_request(count=count),
        documents=[accepting.DocumentInput(key=f"doc-{i:05d}", text=TEXT) for i in range(count)],
    )
    accepted = await accepting.accept_batch(db, request)
    claimed = await jobs.claim_batch(db, pool=factories.POOL, worker_id=WORKER, limit=count, lease_ttl_s=600)
    verdict = validation.validate(DOUBTFUL, source_text=TEXT, policy="invoice-strict-v1").to_json()
    await jobs.finish_many(
        db, [transitions.needs_review(j.id, j.fence, result=DOUBTFUL, validation=verdict) for j in claimed],
        worker_id=WORKER,
    )  # fmt: skip
    return list(accepted.job_ids)


async def _states(db: asyncpg.Connection) -> dict[int, str]:
    return {r["id"]: r["state"] for r in await db.fetch("SELECT id, state FROM extraction_jobs")}


async def test_review_list_and_show_print_the_queue_and_a_case(db: asyncpg.Connection, database_url: str) -> None:
    job_ids = await _awaiting_review(db, count=3)

    first = await _json(database_url, "list", "--limit", "2")
    assert [j["id"] for j in first["jobs"]] == job_ids[:2] and first["next_after"] == job_ids[1]
    job = first["jobs"][0]
    assert (job["tenant"], job["batch"], job["document_key"]) == ("acme", "acme/b1", "doc-00000")
    assert job["failed_checks"] == ["lines_sum_subtotal", "total_sum", "evidence_mismatch"]
    assert job["waiting_since"].endswith("Z") and job["waiting_age_s"] >= 0
    rest = await _json(database_url, "list", "--limit", "2", "--after", str(job_ids[1]), "--tenant", "acme")
    assert [j["id"] for j in rest["jobs"]] == job_ids[2:] and rest["next_after"] is None
    assert (await _json(database_url, "list", "--tenant", "globex"))["jobs"] == []

    table = await _run(database_url, "list", "--limit", "2")
    assert table.returncode == 0, table.stderr
    assert f"--after {job_ids[1]}" in table.stdout
    assert "lines_sum_subtotal, total_sum, evidence_mismatch" in table.stdout

    shown = await _json(database_url, "show", str(job_ids[0]))
    assert (shown["job"]["id"], shown["job"]["state"]) == (job_ids[0], "REVIEW_REQUIRED")
    assert shown["result"]["extracted"] == DOUBTFUL
    assert [c["check"] for c in shown["result"]["verdict"]["failed_checks"]] == [
        "lines_sum_subtotal", "total_sum", "evidence_mismatch"
    ]  # fmt: skip
    assert shown["decisions"] == []
    text = await _run(database_url, "show", str(job_ids[0]))
    assert text.returncode == 0, text.stderr
    assert "lines_sum_subtotal" in text.stdout and "no decisions yet" in text.stdout
    for done in (table, text):
        assert SECRET not in done.stdout + done.stderr


async def test_review_approve_correct_and_reject_decide_and_report(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    approved, corrected, piped, rejected = await _awaiting_review(db, count=4)

    done = await _json(database_url, "approve", str(approved), "--reviewer", "alice", "--reason", "subtotal is fine")
    assert {k: done["decision"][k] for k in ("job_id", "decision", "state", "reviewer", "reason", "verdict")} == {
        "job_id": approved, "decision": "approved", "state": "SUCCEEDED", "reviewer": "alice",
        "reason": "subtotal is fine", "verdict": None,
    }  # fmt: skip
    assert done["decision"]["decided_at"].endswith("Z")

    still_wrong = tmp_path / "corrected.json"
    still_wrong.write_text(json.dumps({**CORRECT, "currency": "XAU"}))
    text = await _run(
        database_url, "correct", str(corrected), "--file", str(still_wrong), "--reviewer", "bob", "--reason", "gold"
    )
    assert text.returncode == 0, text.stderr
    assert f"job {corrected} corrected by bob: SUCCEEDED" in text.stdout
    assert "1 failed; accepted on the reviewer's decision" in text.stdout
    assert "currency_allowed" in text.stdout and "currency XAU is not one of" in text.stdout

    from_stdin = await _json(
        database_url, "correct", str(piped), "--file", "-", "--reviewer", "bob", "--reason", "subtotal misread",
        stdin=json.dumps(CORRECT),
    )  # fmt: skip
    assert from_stdin["decision"]["verdict"] == {"policy": "invoice-strict-v1", "passed": True, "failed_checks": []}
    assert from_stdin["decision"]["state"] == "SUCCEEDED"

    text = await _run(database_url, "reject", str(rejected), "--reviewer", "carol", "--reason", "duplicate")
    assert text.returncode == 0, text.stderr
    assert text.stdout.strip() == f"job {rejected} rejected by carol: FAILED_TERMINAL"

    assert await _states(db) == {approved: "SUCCEEDED", corrected: "SUCCEEDED", piped: "SUCCEEDED",
                                 rejected: "FAILED_TERMINAL"}  # fmt: skip
    shown = await _json(database_url, "show", str(piped))
    [decision] = shown["decisions"]
    assert (decision["decision"], decision["reviewer"], decision["reason"]) == ("corrected", "bob", "subtotal misread")
    assert decision["previous_result"] == DOUBTFUL and decision["corrected_result"]["subtotal"] == "15.00"
    assert shown["result"]["extracted"] == decision["corrected_result"]
    assert shown["result"]["verdict"] == {"passed": True, "failed_checks": []}
    assert await db.fetchval("SELECT count(*) FROM review_decisions") == 4


async def test_review_commands_exit_1_for_a_job_not_awaiting_review_and_2_for_invalid_input(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    decided, waiting = await _awaiting_review(db, count=2)
    assert (await _run(database_url, "approve", str(decided), "--reviewer", "a", "--reason", "ok")).returncode == 0
    before = (await _states(db), await db.fetchval("SELECT count(*) FROM outbox_events"))
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "total": 18.00,\n  oops\n}')
    not_invoice = tmp_path / "not-invoice.json"
    not_invoice.write_text(json.dumps({**CORRECT, "total": 18}))
    sign = ("--reviewer", "bob", "--reason", "why")

    cases: list[tuple[tuple[str, ...], int, str]] = [
        (("reject", str(decided), *sign), 1, f"job {decided} is SUCCEEDED, not REVIEW_REQUIRED; nothing was changed"),
        (("approve", "987654", *sign), 1, "job 987654 not found"),
        (("show", "987654"), 1, "job 987654 not found"),
        (("correct", str(waiting), "--file", str(broken), *sign), 2,
         f"{broken} is not valid JSON: Expecting property name enclosed in double quotes at line 3, column 3"),
        (("correct", str(waiting), "--file", str(not_invoice), *sign), 2,
         "the correction is not a valid invoice.v1 document: total: Input should be a valid string (string_type)"),
        (("correct", str(waiting), "--file", str(tmp_path / "missing.json"), *sign), 2,
         f"cannot read {tmp_path / 'missing.json'}: No such file or directory"),
        (("approve", str(waiting), "--reviewer", " ", "--reason", "ok"), 2, "a reviewer is required"),
        (("approve", str(waiting), "--reviewer", "bob"), 2, "the following arguments are required: --reason"),
        (("approve", "seven", *sign), 2, "invalid job id 'seven'"),
        (("list", "--limit", "0"), 2, "invalid limit '0'"),
    ]  # fmt: skip
    outcomes = await asyncio.gather(*(_run(database_url, *args) for args, _, _ in cases))
    for (args, code, message), done in zip(cases, outcomes, strict=True):
        assert (done.returncode, done.stdout) == (code, ""), (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)

    piped = await _run(database_url, "correct", str(waiting), "--file", "-", *sign, stdin="[1, 2")
    assert piped.returncode == 2
    assert "stdin is not valid JSON: Expecting ',' delimiter at line 1, column 6" in piped.stderr
    assert (await _states(db), await db.fetchval("SELECT count(*) FROM outbox_events")) == before
    assert await db.fetchval("SELECT count(*) FROM review_decisions") == 1


SWAPPED_TEXT = """\
Nordlicht Software GmbH
Hauptstraße 5 · 20457 Hamburg
USt-IdNr.: DE123456789

Rechnung an:
Weber Maschinenbau GmbH
USt-IdNr.: DE811907980

Rechnungsnummer: RE-2025-0042
Rechnungsdatum: 04.03.2025

Beratung   2   617,25   19%   1.234,50

Zwischensumme:   1.234,50
MwSt. 19%:   234,56
Gesamtbetrag:   1.469,06 EUR

IBAN: DE89 3704 0044 0532 0130 00
"""
SWAPPED: dict[str, Any] = {
    "invoice_number": "RE-2025-0042", "issue_date": "2025-03-04", "currency": "EUR",
    "supplier": {"name": "Weber Maschinenbau GmbH", "iban": "DE89370400440532013000"},
    "buyer": {"name": "Nordlicht Software GmbH"},
    "lines": [{"description": "Beratung", "quantity": "2", "unit_price": "617.25", "amount": "1234.50",
               "tax_rate": "19"}],
    "subtotal": "1234.50", "tax_total": "234.56", "total": "1469.06",
    "evidence": {"invoice_number": "RE-2025-0042", "supplier.iban": "DE89 3704 0044 0532 0130 00",
                 "supplier.name": "Weber Maschinenbau GmbH", "buyer.name": "Nordlicht Software GmbH",
                 "lines[0].amount": "1.234,50", "subtotal": "Zwischensumme:   1.234,50",
                 "tax_total": "MwSt. 19%:   234,56", "total": "Gesamtbetrag:   1.469,06 EUR"},
}  # fmt: skip


async def test_review_show_prints_the_quote_and_line_of_each_failed_check(
        db: asyncpg.Connection, database_url: str,
) -> None:
    await factories.seed(db)
    request = dataclasses.replace(
        factories.batch_request(count=1), validation_policy="invoice-strict-v2",
        documents=[accepting.DocumentInput(key="swapped", text=SWAPPED_TEXT)],
    )
    (job_id,) = (await accepting.accept_batch(db, request)).job_ids
    (claimed,) = await jobs.claim_batch(db, pool=factories.POOL, worker_id=WORKER, limit=1, lease_ttl_s=600)
    verdict = validation.validate(SWAPPED, source_text=SWAPPED_TEXT, policy="invoice-strict-v2").to_json()
    await jobs.finish_many(
        db, [transitions.needs_review(claimed.id, claimed.fence, result=SWAPPED, validation=verdict)], worker_id=WORKER
    )

    shown = await _json(database_url, "show", str(job_id))
    checks = shown["result"]["verdict"]["failed_checks"]
    assert [(c["check"], c["field"], c["quote"], c["line"]) for c in checks] == [
        ("party_role", "supplier.name", "Weber Maschinenbau GmbH", 6),
        ("party_role", "buyer.name", "Nordlicht Software GmbH", 1),
    ]
    assert 'under "Rechnung an" (line 5)' in checks[0]["message"]

    text = await _run(database_url, "show", str(job_id))
    assert text.returncode == 0, text.stderr
    for check, quote, line in (("party_role", "Weber Maschinenbau GmbH", "6"), ("party_role", "Nordlicht", "1")):
        row = next(row for row in text.stdout.splitlines() if quote in row and check in row)
        assert f" {line} " in row
    assert "quote" in text.stdout and "line" in text.stdout
