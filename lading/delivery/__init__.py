"""
Delivery of results to ERP webhooks, the library half: what the dispatcher loop
(`lading_worker.dispatching`) and `lading deliveries` build on.

    states.py     the delivery state machine
    building.py   a delivery's body from the stored result
    breaker.py    an endpoint's circuit breaker: which deliveries may be claimed, or probed
    egress.py     the egress policy: which addresses a delivery (or a document fetch) may reach
    secrets.py    where endpoints' signing secrets come from
    resolving.py  what a person does with deliveries no machine moves again (redeliver, resolve)

The body and signatures are the public contract in `lading.webhooks`; the SQL is in
`lading.db.deliveries`.
"""
