"""
`lading worker` whose pool answers with `bench.EvidencedNoopProvider` (the compare benchmark's
SUCCEEDED path: every job passes invoice-strict-v1's validation in full), in real processes.

`python -m compare_peers.lading_noop_worker --processes 2 ...` (PYTHONPATH: hack/) is the
supervisor; its worker processes are this module again (`supervising.CHILD_COMMAND`), so each
builds the same provider. Logging is at WARNING, as for the in-process row (which configures
none), for Celery (`--loglevel WARNING`) and for `lading worker` by default (`--log-level`); at INFO
it would add one line per commit group and one per attempt that did not end well.
Everything else is `lading worker` as shipped.
"""

from __future__ import annotations

import argparse
import sys

import bench
from lading_worker import main, supervising

from lading import logs
from lading.db import registry
from lading.providers import base, factory


def _evidenced_noop(pool: registry.Pool, *, api_key: str | None = None, base_url: str | None = None) -> base.Provider:
    return bench.EvidencedNoopProvider()


factory.for_pool = _evidenced_noop
supervising.CHILD_COMMAND = (sys.executable, "-m", "compare_peers.lading_noop_worker")



def _main() -> int:
    logs.configure(level="WARNING")
    parser = argparse.ArgumentParser(prog="lading_noop_worker")
    main.add_arguments(parser)
    return main.run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(_main())
