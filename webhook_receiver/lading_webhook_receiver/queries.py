"""
The receiver's named SQL, loaded from its own `sql/*.sql` by the core's loader
(`lading.db.queries.Loader`): the same `-- name:` convention, kept in files of its own because
these tables live in the ERP's database, not Lading's.

Loading fails on a duplicate name; parameters always go through `$n` placeholders.
"""

from __future__ import annotations

from lading.db import queries

LOADER = queries.Loader(__package__ or "lading_webhook_receiver")
sql = LOADER.sql


ERP_INBOX_CLAIM = sql("erp_inbox_claim")
ERP_INBOX_GET = sql("erp_inbox_get")
ERP_INBOX_RECORD_ANSWER = sql("erp_inbox_record_answer")
ERP_INBOX_COUNT_BY_STATUS = sql("erp_inbox_count_by_status")
ERP_INBOX_DELETE_EXPIRED = sql("erp_inbox_delete_expired")
ERP_INBOX_OLDEST_AGE = sql("erp_inbox_oldest_age")
LEDGER_INVOICES_BOOK = sql("ledger_invoices_book")
LEDGER_INVOICES_GET_REFERENCE = sql("ledger_invoices_get_reference")
LEDGER_INVOICES_COUNT = sql("ledger_invoices_count")
ERP_INBOX_CLAIM_MANY = sql("erp_inbox_claim_many")
ERP_INBOX_GET_MANY = sql("erp_inbox_get_many")
ERP_INBOX_RECORD_ANSWERS = sql("erp_inbox_record_answers")
LEDGER_INVOICES_BOOK_MANY = sql("ledger_invoices_book_many")
LEDGER_INVOICES_GET_REFERENCES = sql("ledger_invoices_get_references")
