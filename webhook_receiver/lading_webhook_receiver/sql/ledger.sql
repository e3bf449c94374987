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
