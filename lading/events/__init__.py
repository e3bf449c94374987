"""
Events: the outbox relay to RabbitMQ and the ingress consumer with its durable inbox.

    PostgreSQL                               RabbitMQ
    outbox_events --(relay.OutboxRelay)--> exchange lading.events (topic, key = event type)
                                               |  batch.accepted.v1, extraction.*.v1
                                               v
    execution_inbox <--(ingress.IngressConsumer)-- quorum queue lading.ingress
                                               |  rejected / over x-delivery-limit
                                               v
                                           lading.dlx (fanout) -> lading.ingress.dead

    topology.py   what is declared on the broker, idempotently, with RabbitMQ 3.10 arguments
    messages.py   outbox row -> AMQP message, AMQP message -> validated event + digest
    relay.py      claim committed events, publish with confirms, then mark published
    ingress.py    record each event in the inbox in the transaction of its effect, ack after commit

The broker is optional: with none configured, LISTEN/NOTIFY and polling wake the claimers
(lading_worker.claiming) and the outbox simply keeps its rows. docs/events.md is the
operator's page: guarantees, arguments and the "outbox stuck" runbook.
"""
