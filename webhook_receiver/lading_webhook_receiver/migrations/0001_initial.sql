-- The receiver's own tables, in the ERP team's database (not Lading's).
--
-- erp_inbox: one row per webhook delivery id, written in the same transaction as the ERP
-- effect. A row exists if and only if its effect was committed; `status` and `reference` are
-- the answer given, and given again to every redelivery of the same id and body.
--
-- ledger_invoices: the reference ERP ("ledger"). One row per business intent: an invoice is
-- keyed by (tenant, supplier identity, invoice number), so the same document arriving in
-- another delivery (uploaded again in a new batch) is not booked twice.

CREATE TABLE erp_inbox (
    delivery_id    text PRIMARY KEY CHECK (length(delivery_id) BETWEEN 1 AND 256),
    payload_sha256 bytea NOT NULL CHECK (octet_length(payload_sha256) = 32),
    event_type     text NOT NULL,
    adapter        text NOT NULL,
    status         text CHECK (status IN ('accepted', 'duplicate')),
    reference      text,
    received_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- Written by the claiming statement, completed before the same transaction commits.
    CHECK ((status IS NULL) = (reference IS NULL))
);

CREATE INDEX erp_inbox_received_at ON erp_inbox (received_at);

CREATE TABLE ledger_invoices (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reference         text GENERATED ALWAYS AS ('LDG-' || lpad(id::text, 10, '0')) STORED UNIQUE,
    tenant            text NOT NULL,
    supplier_identity text NOT NULL,
    invoice_number    text NOT NULL,
    supplier_name     text NOT NULL,
    supplier_vat_id   text,
    currency          text NOT NULL,
    total             numeric(21, 6) NOT NULL,
    issue_date        date NOT NULL,
    document          jsonb NOT NULL,
    lading_job_id     text NOT NULL,
    delivery_id       text NOT NULL,
    booked_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (tenant, supplier_identity, invoice_number)
);
