"""
The fault suite: every fault Lading claims to survive, injected into real processes, with a
history recorded while it runs and a checker that derives the figures from that history alone.

    cluster.py     the system under test: a PostgreSQL server the suite owns, RabbitMQ under a
                   private name prefix, the Kubernetes emulator, `lading operator`, `lading worker`
                   x3, `lading relay`, `lading receiver`, the stub model, and a fault proxy in front
                   of every network leg
    nemesis.py     the faults: signals, proxy modes, a PostgreSQL crash-restart, model faults,
                   a clock step, each logged with its start and end
    history.py     the recorder: job states, attempts and fences by polling, every published event
                   from a side queue, the final tables of Lading and of the ERP, the model's log
    checker.py     the figures, computed from a history and nothing else
    scenarios.py   the scenarios and the profiles (short, full, soak)
    report.py      the table

The entry point is hack/reliability.py (`make reliability`); docs/reliability.md says how to
read the table. Only the documented command lines of the processes are used, never their modules.
"""
