"""
Kubernetes events the operator posts on purpose: admission, suspension, completion, failures,
scaling, drift, missing Secrets. kopf's own per-handler events are posted only from WARNING up
(`app.kopf_settings`), so these are what `kubectl describe` shows.

Messages are bounded and are built only from counts, names and reasons: never from Secret values,
document text or model output.
"""

from __future__ import annotations

import kopf

MESSAGE_MAX = 1024


def normal(body: kopf.Body, *, reason: str, message: str) -> None:
    kopf.event(body, type="Normal", reason=reason, message=message[:MESSAGE_MAX])


def warning(body: kopf.Body, *, reason: str, message: str) -> None:
    kopf.event(body, type="Warning", reason=reason, message=message[:MESSAGE_MAX])
