"""
The only place SQL lives.

    pool.py        connection pools with the codecs every repository expects
    migrating.py   versioned migrations under an advisory lock
    queries.py     named queries loaded from sql/*.sql
    embedded.py    a real PostgreSQL server started on demand (`lading run`, tests)
    jobs.py, batches.py, attempts.py, outbox.py   repositories: one function per query
"""
