"""
The only place Lading's SQL lives: named queries in `sql/*.sql`, one file per table, and one
repository function per query (tests/unit/layout/test_sql_in_repositories.py fails on SQL run
anywhere else). Repositories take a connection and never open transactions of their own: the
caller decides the unit of work.

Infrastructure
    pool.py            connection pools with the codecs every repository expects
    queries.py         the loader of named queries and fragments (`job_eligible`); also reads
                       another package's sql/ folder (the webhook receiver's)
    migrating.py       versioned migrations (`migrations/NNNN_*.sql`) under an advisory lock
    embedded.py        a real PostgreSQL server started on demand (`lading run`, tests)
    conflicts.py       retrying a unit of work that lost a deadlock or serialization conflict
    locks.py           lock timeouts and session advisory locks (elections)

Repositories, by table (queries in sql/<file>)
    jobs.py            extraction_jobs: allocation, COPY, the claim, finish, heartbeat, release,
                       reap, expiry, cancel, review moves; its attempts and stale completions;
                       `lading jobs` and the operator's failures      jobs.sql, attempts.sql,
                                                                stale_completions.sql
    job_documents.py   job_documents and the manifest_lines staging table
                                                                job_documents.sql, manifest_lines.sql
    batches.py         batches: insert, lookup by key, suspension, progress, what the operator
                       observes, batches in progress               batches.sql
    outbox.py          outbox_events and the ingress inbox      outbox.sql
    deliveries.py      deliveries, delivery attempts, endpoint health         deliveries.sql
    registry.py        tenants, pools, endpoints (what the operator mirrors); what admission
                       reads of them at once; a tenant's quota use, a pool's load for the scaler
                       and its status line              tenants.sql, pools.sql, admission.sql
    fairness.py        tenant_queues and daily token budgets    tenant_queues.sql, tenants.sql
    queue.py           a batch's place in its pool's queue: its priority changed on its jobs,
                       its queue position and ETA (operator, `lading status`)  queue.sql
    limiter.py         limiter_permits, limiter_seconds, limiter_estimates and limiter_waiters
                                                                limiter.sql
    results.py         results as a reviewer corrects them, and as people read them  results.sql
    review_decisions.py  the review audit trail                 review_decisions.sql
    retention.py       the cleaner's deletes, one per table, next to the index each walks
                                                                (in each table's file)
    catalog.py         the catalog: whether a table exists, every table's size  catalog.sql
    submissions.py     document_submissions: single documents' idempotency, and the first and
                       last statements of their acceptance      document_submissions.sql
    api_tokens.py      api_tokens: the HTTP intake's bearer tokens (digests)  api_tokens.sql
    api_requests.py    api_requests: the HTTP intake's idempotency record     api_requests.sql

By reader (over other tables' rows)
    reuse.py           result reuse: resolve, finish the jobs that took one    jobs.sql
    spend.py           what model calls cost, read back         tenant_spend.sql, attempts.sql,
                                                                batches.sql
    api_views.py       what the HTTP intake reads               api_views.sql

Reports for people (`lading jobs`, `lading status`) are the `*_report` queries, each read by the
repository of its table; `backlogs.py` holds what they share (a queue's size and oldest age).
"""
