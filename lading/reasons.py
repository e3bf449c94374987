"""
The reasons the core gives when it refuses to admit a batch (`applying.AdmissionRejected.reason`).

They are CamelCase, a closed set, and part of the contract: the operator writes them unchanged as
the reason of an ExtractionBatch's `Admitted=False` condition and of its Warning Event, `lading run`
prints them, and `lading_admission_rejections_total` is labelled by them. Defined once here so the
core and the operator cannot drift apart.
"""

from __future__ import annotations

from typing import Final

NO_TENANT_QUOTA: Final = "NoTenantQuota"
"""No TenantQuota covers the batch's namespace (or two do: the message names them); admitted as
soon as exactly one does."""

PRIORITY_NOT_ALLOWED: Final = "PriorityNotAllowed"
"""The quota's `allowedPriorities` does not list the batch's priority."""

POOL_NOT_ALLOWED: Final = "PoolNotAllowed"
"""The quota's `allowedPools` does not list the batch's pool (checked before the pool's existence)."""

POOL_NOT_FOUND: Final = "PoolNotFound"
"""The referenced InferencePool does not exist (yet)."""

QUOTA_EXCEEDED: Final = "QuotaExceeded"
"""The tenant's queue (`maxQueuedJobs` or `maxQueuedBytes`) has no room for the batch; it waits in
the quota queue."""

INVALID_SPEC: Final = "InvalidSpec"
"""The spec does not parse or breaks a rule over the whole batch; the message names the field."""

INVALID_MANIFEST: Final = "InvalidManifest"
"""The manifest (spec.manifestUri) has an invalid line or breaks a limit; nothing is admitted."""

MANIFEST_UNAVAILABLE: Final = "ManifestUnavailable"
"""The manifest could not be read now (`manifest_lines.ManifestUnavailable`, a TemporaryError):
admission is retried unchanged; the operator writes no condition for it."""

CURRENCY_MISMATCH: Final = "CurrencyMismatch"
"""The batch's pool is priced (spec.pricing) in another currency than the tenant's budget
(TenantQuota spec.budget): a budget counts only pools priced in its currency, never with an exchange
rate; admitted once the pool or the budget changes."""

IDEMPOTENCY_CONFLICT: Final = "IdempotencyConflict"
"""A batch with this identity was accepted with different content."""

ADMISSION: Final = frozenset({
    NO_TENANT_QUOTA, PRIORITY_NOT_ALLOWED, POOL_NOT_ALLOWED, POOL_NOT_FOUND, QUOTA_EXCEEDED, INVALID_SPEC,
    INVALID_MANIFEST, MANIFEST_UNAVAILABLE, IDEMPOTENCY_CONFLICT, CURRENCY_MISMATCH,
})  # fmt: skip
"""Every reason a batch can be refused admission with."""
