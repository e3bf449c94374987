"""
Events, the library half: what goes over RabbitMQ and how the broker is laid out. The loops that
move events (the outbox relay, the ingress consumer) are process code, in `lading_worker`.

    PostgreSQL                                    RabbitMQ
    outbox_events --(lading_worker.relaying)--> exchange lading.events (topic, key = event type)
                                                    |  batch.accepted.v1, extraction.*.v1
                                                    v
    execution_inbox <--(lading_worker.consuming)-- quorum queue lading.ingress
                                                    |  rejected / over x-delivery-limit
                                                    v
                                                lading.dlx (fanout) -> lading.ingress.dead

    topology.py   what is declared on the broker, idempotently, with RabbitMQ 3.10 arguments
    messages.py   outbox row -> AMQP message, AMQP message -> validated event + digest

The broker is optional: with none configured, LISTEN/NOTIFY and polling wake the claimers
(lading_worker.claiming) and the outbox simply keeps its rows. docs/events.md is the
operator's page: guarantees, arguments and the "outbox stuck" runbook.
"""
