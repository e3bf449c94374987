"""Real worker processes for crash tests: started, signalled and reaped by PID."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import signal
import sys
from collections.abc import Mapping, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE_ROOTS = [ROOT, ROOT / "api", ROOT / "worker", ROOT / "operator", ROOT / "webhook_receiver", ROOT / "cli"]


def environment(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LADING_FAILPOINTS", None)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in SOURCE_ROOTS)
    env.update(extra)
    return env


async def start_worker(
        database_url: str,
        pool: str,
        *,
        args: Sequence[str] = (),
        failpoints: str | None = None,
        log: pathlib.Path,
        env: Mapping[str, str] | None = None,
) -> asyncio.subprocess.Process:
    extra = {**(env or {}), **({"LADING_FAILPOINTS": failpoints} if failpoints else {})}
    if "--processes" not in args:
        args = ["--processes", "1", *args]  # one process, whatever the machine's CPUs: the tests' worker
    handle = log.open("ab")
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lading_worker", "--database-url", database_url, "--pool", pool, *args,
            env=environment(**extra), stdout=handle, stderr=handle,
        )  # fmt: skip
    finally:
        handle.close()


async def stop(process: asyncio.subprocess.Process) -> None:
    """Kill a process we started, if it still runs, and reap it."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)  # a stopped process must run to die
            process.kill()
    await process.wait()


def children_of(pid: int) -> set[int]:
    """Process ids whose parent is `pid` (from /proc), e.g. the worker processes of a supervisor."""
    found = set()
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry.name))
    return found
