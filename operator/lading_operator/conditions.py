"""
Building status and writing it only when it changed.

A condition keeps its `lastTransitionTime` while its status stays the same (Kubernetes'
convention: the time says when it last flipped, not when we last looked), so re-computing an
unchanged status yields an identical dict and `write_status` sends nothing. That is what bounds
the operator's API traffic at steady state: a refresh that finds nothing new costs no request.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from lading_operator import kube, status

logger = logging.getLogger("lading.operator")

RECONCILE_ERROR = "ReconcileError"
"""Warning Event reason: a reconcile step failed on something other than the database or the API
server (a bug); the loop logs the traceback and retries with backoff."""


def now() -> str:
    return status.rfc3339(datetime.datetime.now(tz=datetime.UTC))


def condition(
    previous: Sequence[Mapping[str, Any]] | None,
    *,
    type: str,
    value: bool | None,
    reason: str,
    message: str = "",
    generation: int | None = None,
) -> status.Condition:
    """A condition; its lastTransitionTime is carried over from `previous` when its status did not flip."""
    text = "Unknown" if value is None else ("True" if value else "False")
    moment = now()
    for old in previous or ():
        if old.get("type") == type and old.get("status") == text and old.get("lastTransitionTime"):
            moment = str(old["lastTransitionTime"])
    return status.Condition(
        type=type,
        status=text,  # type: ignore[arg-type]
        reason=reason,
        message=message[:1024],
        last_transition_time=moment,
        observed_generation=generation,
    )


def dump(model: Any) -> dict[str, Any]:
    return dict(model.model_dump(mode="json", by_alias=True, exclude_none=True))


def changed(live: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """Whether writing `desired` (a merge patch of .status) would change `live` .status."""
    live = live or {}
    return any(live.get(key) != value for key, value in desired.items())


async def write_status(
    api: kube.Client,
    *,
    api_version: str,
    plural: str,
    namespace: str | None,
    name: str,
    live: Mapping[str, Any] | None,
    desired: Mapping[str, Any],
) -> bool:
    """Merge-patch .status to `desired` when it differs from `live`; True when a request was sent."""
    if not changed(live, desired):
        return False
    path = kube.path(api_version, plural, namespace=namespace, name=name, sub="status")
    await api.merge_patch(path, {"status": dict(desired)})
    return True
