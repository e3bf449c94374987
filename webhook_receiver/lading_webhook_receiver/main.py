"""
The receiver process: `lading receiver ...` (see lading_cli.receiver for the options).

Runs `serving.receiving` until SIGTERM or SIGINT, then shuts down gracefully: stops
accepting connections, lets deliveries in flight commit and answer (up to the grace),
closes the pool.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence

from lading_webhook_receiver import serving, settings

logger = logging.getLogger(__name__)


async def serve(
        *,
        database_url: str,
        secrets: Sequence[str],
        host: str,
        port: int,
        config: settings.ReceiverSettings,
        ready: asyncio.Event | None = None,
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with serving.receiving(
            database_url=database_url, secrets=secrets, host=host, port=port, config=config
        ) as server:
            # One line an operator (or a test) can wait for; never the secrets or the database URL.
            print(f"lading receiver: listening on {server.url} ({len(secrets)} secret(s))", flush=True)
            if ready is not None:
                ready.set()
            await stop.wait()
            logger.info("Stopping: finishing deliveries in flight")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
