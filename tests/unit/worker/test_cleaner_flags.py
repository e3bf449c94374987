"""The worker's retention flags: hours on the command line, seconds in CleanerSettings; a retention
that would delete rows still needed stops the worker with the reason."""

from __future__ import annotations

import argparse

import pytest
from lading_worker import cleaning, main


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    main.add_arguments(parser)
    return parser.parse_args(["--pool", "lading-system/builtin", *argv])


def test_defaults_are_the_settings_defaults() -> None:
    assert main.cleaner_from(_parse()) == cleaning.CleanerSettings()


def test_hours_become_seconds() -> None:
    settings = main.cleaner_from(_parse(
        "--retain-published-events-hours", "2", "--retain-inbox-hours", "48", "--retain-delivered-hours", "0.5",
        "--retain-limiter-hours", "0.25", "--cleaner-batch", "500", "--cleaner-interval", "10",
    ))  # fmt: skip
    assert settings.outbox_published_s == 7200 and settings.inbox_s == 48 * 3600
    assert settings.delivered_s == 1800 and settings.limiter_s == 900
    assert settings.batch_size == 500 and settings.interval_s == 10


def test_an_inbox_retention_inside_the_dedup_floor_is_refused() -> None:
    with pytest.raises(ValueError, match="inbox retention must be at least 86400 s"):
        main.cleaner_from(_parse("--retain-inbox-hours", "1"))
