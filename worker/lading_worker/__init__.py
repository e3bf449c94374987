"""
The worker: claims jobs of one InferencePool and runs them, safely in many replicas.

    running.py       the Worker: every loop wired as a named task; graceful drain on stop
    claiming.py      Claimer: fenced batch claims, bounded concurrency, LISTEN/NOTIFY wake-ups
    executing.py     Executor: one attempt = model call + validation + retry decision -> Finish
    committing.py    Committer: group commit of many finished attempts in one statement
    heartbeating.py  Heartbeater: extends owned leases; cancels attempts whose lease is gone
    reaping.py       Reaper: rescues expired leases, fails jobs past their deadline
    inflight.py      InFlight: the attempts running in this process (not lading.db.registry)
"""
