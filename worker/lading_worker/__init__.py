"""
The worker process package: every background loop of Lading's data plane, wired in one place.

    running.py       the Worker: every loop wired as a named task; graceful drain on stop
    main.py          `lading worker` / `python -m lading_worker`: flags, waiting for the schema, signals
    claiming.py      Claimer: fenced batch claims, bounded concurrency, LISTEN/NOTIFY wake-ups
    executing.py     Executor: one attempt = model call + validation + retry decision -> Finish
    committing.py    Committer: group commit of many finished attempts in one statement
    heartbeating.py  Heartbeater: extends owned leases; cancels attempts whose lease is gone
    reaping.py       Reaper: rescues expired leases, fails jobs past their deadline
    inflight.py      InFlight: the attempts running in this process (not lading.db.registry)
    dispatching.py   Dispatcher: delivery lanes, the delivery reaper and the health refresh
    relaying.py      OutboxRelay: committed outbox rows -> RabbitMQ, with publisher confirms
    consuming.py     IngressConsumer: RabbitMQ -> the durable inbox, ack after commit
    broker.py        BrokerConfig: the relay and consumer as named loops (`lading relay` runs them alone)
    cleaning.py      Cleaner: deletes rows past their retention, in one elected worker

Every loop has the shape of `lading.looping` (run_once, wait or stop, back off). The library
they build on (state machines, repositories, message formats, signing, egress, the limiter) is
the core, `lading`; the gauge refresher and the election it shares with the cleaner are
`lading_elected`, which the operator runs too. This package never holds SQL of its own.
"""
