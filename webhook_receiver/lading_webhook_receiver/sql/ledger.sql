-- name: ledger_invoices_book
-- Book an invoice unless its business intent is booked already. The unique key decides
-- concurrent deliveries of the same intent: the loser waits for the winner's commit and
-- gets no row back (then reads the winner's reference with ledger_invoices_get_reference).
INSERT INTO ledger_invoices (
    tenant, supplier_identity, invoice_number, supplier_name, supplier_vat_id,
    currency, total, issue_date, document, lading_job_id, delivery_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (tenant, supplier_identity, invoice_number) DO NOTHING
RETURNING reference;

-- name: ledger_invoices_get_reference
SELECT reference FROM ledger_invoices
 WHERE tenant = $1 AND supplier_identity = $2 AND invoice_number = $3;

-- name: ledger_invoices_count
SELECT count(*) FROM ledger_invoices;

-- name: ledger_invoices_book_many
-- Book a group of invoices in one statement, each unless its business intent is booked already
-- (by an earlier delivery, by a concurrent group, whose commit the statement waits for, or by
-- an earlier row of this same group: ON CONFLICT DO NOTHING skips it too). Rows go in intent
-- key order (then the group's order), so two groups booking overlapping intents lock them in one
-- order. Returns the delivery id and reference of each row booked; the others read the
-- reference of their intent with ledger_invoices_get_references.
INSERT INTO ledger_invoices (
    tenant, supplier_identity, invoice_number, supplier_name, supplier_vat_id,
    currency, total, issue_date, document, lading_job_id, delivery_id)
SELECT t.tenant, t.supplier_identity, t.invoice_number, t.supplier_name, t.supplier_vat_id,
       t.currency, t.total, t.issue_date, t.document, t.lading_job_id, t.delivery_id
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::numeric[],
              $8::date[], $9::jsonb[], $10::text[], $11::text[]) WITH ORDINALITY
       AS t(tenant, supplier_identity, invoice_number, supplier_name, supplier_vat_id, currency, total,
            issue_date, document, lading_job_id, delivery_id, ord)
 ORDER BY t.tenant, t.supplier_identity, t.invoice_number, t.ord
ON CONFLICT (tenant, supplier_identity, invoice_number) DO NOTHING
RETURNING delivery_id, reference;

-- name: ledger_invoices_get_references
-- The reference of each intent ($1, $2, $3 side by side); a new statement, so under READ
-- COMMITTED it sees the rows whose commit the booking waited for, and this transaction's own.
SELECT l.tenant, l.supplier_identity, l.invoice_number, l.reference
  FROM ledger_invoices l
  JOIN unnest($1::text[], $2::text[], $3::text[]) AS t(tenant, supplier_identity, invoice_number)
    ON l.tenant = t.tenant AND l.supplier_identity = t.supplier_identity AND l.invoice_number = t.invoice_number;
