"""
Lading core library: everything the operator, the workers and the CLI share.

The core never imports a component (`lading_worker`, `lading_operator`,
`lading_webhook_receiver`, `lading_cli`) nor the demo code (`lading_demo`: the synthetic invoice
generator, the calibration corpora and the rule-based `builtin` extractor, which the provider
factory loads by name only for a `provider: builtin` pool); an import-linter contract checks it.

    models/      pydantic spec models, the YAML manifests `lading run` applies, extraction schemas
    jobs/        the job state machine, transitions, the one RetryPolicy, request hashing
    db/          the only place SQL lives: pool, migrations, named queries, repositories
    delivery/    delivery state machine, body building, breaker, egress policy, signing secrets
    events/      broker topology and message formats (the relay and consumer loops: lading_worker)
    webhooks/    the delivery body and its signatures (the public contract with receivers)
    providers/   the model provider seam and the real providers
    validation/  checks that decide SUCCEEDED vs REVIEW_REQUIRED
    documents/   JSON-lines manifests of large batches (manifest_lines) and fetching documents by URI
    accepting    durable acceptance of a batch in one transaction
    applying     admission: every quota rule, then acceptance
    looping      the one loop shape: waits, jitter, backoff, run_forever, named tasks
    reasons      why admission refuses a batch (the reasons the operator writes as conditions)
    schema       waiting for `lading migrate`: no process but the migrator changes the schema
"""

__version__ = "0.1.0"
