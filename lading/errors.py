"""
The one exception root of Lading, so callers can tell "try again" from "stop".

    LadingError
    ├── TemporaryError              retry later: the work is fine, the world is not
    │   ├── AcceptanceInProgress    the same acceptance is being committed by someone else (HTTP 409)
    │   ├── documents.manifest_lines.ManifestUnavailable   a batch's manifest cannot be read now
    │   └── documents.fetching.DocumentUnavailable    a document cannot be read now (transient)
    └── PermanentError              never retry as is
        ├── ManifestError           a YAML manifest is invalid; names the file, document and field
        ├── IdempotencyConflict     same idempotency key, different canonical request (HTTP 422)
        ├── IllegalTransition       a state change the state machine does not allow
        ├── MigrationError          the database schema is ahead of or diverges from this code
        ├── UnknownPolicy           a validation policy name this code does not know
        ├── applying.AdmissionRejected   a batch or document was not admitted (NoTenantQuota, QuotaExceeded, ...)
        │   ├── applying.InvalidManifest  its document manifest is invalid (reason InvalidManifest)
        │   └── applying.InvalidDocument  a single document's fields are invalid (every field error)
        ├── applying.PricingCurrencyChanged   a priced InferencePool's spec.pricing names another currency
        ├── intake.IdempotencyMismatch   a document's idempotency key was used for another request
        ├── documents.manifest_lines.ManifestInvalid   a manifest line is invalid (names the line and field)
        ├── documents.fetching.DocumentNotFound, DocumentRefused, DigestMismatch, DocumentNotText
        └── reviewing.JobNotFound, NotAwaitingReview, ReviewInputInvalid (CorrectionInvalid)

Errors that belong to one module's contract are defined there, under these roots.
"""

from __future__ import annotations


class LadingError(Exception):
    """Root of every error Lading raises on purpose."""


class TemporaryError(LadingError):
    """The operation may succeed if retried later, unchanged."""


class AcceptanceInProgress(TemporaryError):
    """Another transaction is accepting the same batch right now; retry after it commits."""


class PermanentError(LadingError):
    """Retrying the same operation unchanged cannot succeed."""


class ManifestError(PermanentError):
    """A manifest document is invalid. The message names the file, the document and the field."""


class IdempotencyConflict(PermanentError):
    """The idempotency key was already used for a request with a different canonical hash."""

    def __init__(self, *, key: str, stored_hash: str, new_hash: str) -> None:
        super().__init__(
            f"idempotency key {key!r} was already used for a different request "
            f"(stored hash {stored_hash[:16]}…, this request {new_hash[:16]}…); nothing was changed"
        )
        self.key = key
        self.stored_hash = stored_hash
        self.new_hash = new_hash


class IllegalTransition(PermanentError):
    """A job state change outside the table in `lading.jobs.states`."""


class MigrationError(PermanentError):
    """The database holds migrations this code does not know, or a migration file changed."""


class UnknownPolicy(PermanentError):
    """A validation policy name that `lading.validation.known_policies()` does not list."""

    def __init__(self, *, policy: str, known: frozenset[str]) -> None:
        super().__init__(f"unknown validation policy {policy!r}; known policies: {', '.join(sorted(known))}")
        self.policy = policy
        self.known = known
