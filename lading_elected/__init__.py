"""
Database-wide jobs that one elected process does for every replica, shared by the worker and the
operator (components do not import each other; both import this package, which imports only the
core).

    election.py  Election (a session advisory lock on a dedicated connection) and run_elected, the
                 loop of an elected job: stand, work if elected, resign on a database failure
    gauges.py    the gauge refresher: the database gauges (jobs by state, oldest eligible age,
                 review queue, outbox backlog, pools paused or cooling), refreshed by the elected
                 process only; every worker and the operator stand for it

The worker's cleaner (`lading_worker.cleaning`) stands in the same kind of election, on a key of
its own.
"""
