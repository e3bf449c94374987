"""
The reference ERP-side webhook receiver: verifies Standard Webhooks signatures, records
each delivery durably by its delivery id before answering 2xx, and applies the ERP effect
once however often a delivery is retried, and once per business intent however many
deliveries carry it.

    settings.py   ReceiverSettings (tolerance, body limit, pool, timeouts) and the URL path
    app.py        the aiohttp handlers: checks in order, answers, health, metrics
    inbox.py      the inbox transaction: inbox rows + ERP effects of a group of deliveries
                  (GroupCommitter), each answered after the commit that holds it
    adapters.py   the ErpAdapter seam (prepare, apply, optionally apply_many) and its contract
    ledger.py     the `ledger` adapter: invoices in the receiver's own table, deduplicated
                  by (tenant, supplier identity, invoice number)
    cleaning.py   InboxCleaner: deletes inbox rows past the retention (never inside the dedup window)
    metrics.py    the receiver's own Prometheus registry
    serving.py    `receiving(...)`: pool + server as one async context (waits for its schema);
                  `migrate(url)`: applies its migrations (`lading migrate --receiver`, `lading run`)
    main.py       the process behind `lading receiver` (graceful shutdown on SIGTERM)

In-process use (`lading run`, tests):

    from lading_webhook_receiver import ledger, serving

    await serving.migrate(url)              # the receiver waits for its schema, never applies it
    async with serving.receiving(database_url=url, secrets=["whsec_..."], host="127.0.0.1", port=0) as server:
        server.url                          # POST deliveries here
        server.counts()                     # accepted / duplicate_delivery / duplicate_intent / rejected
        await server.ledger_count()         # ERP records booked (ledger.count(conn) on any connection)

The receiver keeps its tables in its own database (an ERP team's; it may also share Lading's):
`erp_inbox` and `ledger_invoices` in the connection's current schema, and its migration
history in `lading_receiver.schema_migrations`. It imports only the `lading` core.
"""
