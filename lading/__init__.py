"""
Lading core library: everything the operator, the workers and the CLI share.

The core never imports a component (`lading_worker`, `lading_operator`,
`lading_webhook_receiver`, `lading_cli`); an import-linter contract checks it.

    models/      pydantic spec models and the extraction schemas (invoice.v1)
    jobs/        the job state machine, transitions, retry policy, request hashing
    db/          the only place SQL lives: pool, migrations, named queries, repositories
    providers/   the model provider seam and the built-in offline extractor
    validation/  checks that decide SUCCEEDED vs REVIEW_REQUIRED
    samples/     the synthetic OCR invoice generator with ground truth
    documents/   manifests of large batches (streaming, validation) and fetching documents by URI
    accepting    durable acceptance of a batch in one transaction
"""

__version__ = "0.1.0"
