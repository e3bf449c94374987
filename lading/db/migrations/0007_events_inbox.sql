-- The durable inbox of the broker ingress consumer (lading/events/ingress.py).
-- A message's event_id is recorded here in the same transaction as its effect, and the
-- broker is acked only after that commit: a redelivery finds the row and changes nothing.
-- The digest is over the event's type and canonical payload; a redelivery of the same id
-- with another digest is not applied but kept in inbox_quarantine for an operator.

CREATE TABLE execution_inbox (
    event_id    uuid        PRIMARY KEY,
    type        text        NOT NULL,
    digest      text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    payload     jsonb       NOT NULL
);
CREATE INDEX execution_inbox_received ON execution_inbox (received_at);

CREATE TABLE inbox_quarantine (
    event_id     uuid        NOT NULL,
    digest       text        NOT NULL,
    first_digest text        NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    payload      jsonb       NOT NULL,
    PRIMARY KEY (event_id, digest)
);

