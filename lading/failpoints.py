"""
Named failpoints: precise crash and fault injection at a chosen line of code.

Enabled by the environment of a process (`LADING_FAILPOINTS="worker.after_model_before_commit=kill"`,
several separated by `;`) or, in-process, by `enabled(...)` in tests. Actions:

    kill        SIGKILL this process (a real crash: no finally blocks, no flush)
    raise       raise FailpointError (the surrounding transaction must roll back)
    sleep(MS)   pause this many milliseconds (async points only block their own task)
    exit(CODE)  os._exit(CODE)

An action may be limited to the Nth hit: `name=kill@3` kills on the third hit only.
A failpoint that is not enabled costs one dictionary lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import signal
import time
from collections.abc import Iterator

ENV_VAR = "LADING_FAILPOINTS"
_SPEC = re.compile(r"^(kill|raise|sleep\((\d+)\)|exit\((\d+)\))(?:@(\d+))?$")


class FailpointError(RuntimeError):
    """Raised by a failpoint whose action is `raise`."""


@dataclasses.dataclass
class _Action:
    kind: str
    arg: int = 0
    on_hit: int | None = None
    hits: int = 0


def _parse(text: str) -> dict[str, _Action]:
    actions: dict[str, _Action] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, _, spec = item.partition("=")
        match = _SPEC.match(spec.strip())
        if not name or not match:
            raise ValueError(f"bad failpoint {item!r} in ${ENV_VAR}; expected name=kill|raise|sleep(MS)|exit(CODE)[@N]")
        kind = match[1].split("(")[0]
        arg = int(match[2] or match[3] or 0)
        actions[name.strip()] = _Action(kind, arg, int(match[4]) if match[4] else None)
    return actions


_active: dict[str, _Action] = _parse(os.environ.get(ENV_VAR, ""))


def _due(name: str) -> _Action | None:
    action = _active.get(name)
    if action is None:
        return None
    action.hits += 1
    if action.on_hit is not None and action.hits != action.on_hit:
        return None
    return action


def _act(name: str, action: _Action) -> None:
    if action.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.kind == "exit":
        os._exit(action.arg)
    elif action.kind == "raise":
        raise FailpointError(f"failpoint {name} fired")


def hit(name: str) -> None:
    """A synchronous failpoint."""
    action = _due(name)
    if action is None:
        return
    if action.kind == "sleep":
        time.sleep(action.arg / 1000)
    else:
        _act(name, action)


async def ahit(name: str) -> None:
    """An asynchronous failpoint: `sleep` blocks only the calling task."""
    action = _due(name)
    if action is None:
        return
    if action.kind == "sleep":
        await asyncio.sleep(action.arg / 1000)
    else:
        _act(name, action)


@contextlib.contextmanager
def enabled(name: str, spec: str) -> Iterator[None]:
    """Enable one failpoint in this process for the duration of a `with` block (tests)."""
    previous = _active.get(name)
    _active.update(_parse(f"{name}={spec}"))
    try:
        yield
    finally:
        if previous is None:
            _active.pop(name, None)
        else:
            _active[name] = previous
