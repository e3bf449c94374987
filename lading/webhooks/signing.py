"""Standard Webhooks signatures (https://www.standardwebhooks.com/), both sides.

The scheme, exactly as the specification and its reference libraries (PyPI `standardwebhooks`,
Svix) implement it, so that any of them accepts what we send and we accept what they send:

- a secret is written `whsec_` + base64 of the key bytes;
- the signed content is `{webhook-id}.{webhook-timestamp}.{body}` (body as sent, bytes);
- `webhook-signature` is a space-separated list of `v1,` + base64(HMAC-SHA256(key, content)),
  one entry per active secret, so a receiver holding either the old or the new secret accepts
  a delivery during a rotation.

Verification compares in constant time and checks the timestamp against a tolerance, which
bounds how long a captured request can be replayed (the receiver's inbox dedups the rest).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping, Sequence

SECRET_PREFIX = "whsec_"
SIGNATURE_VERSION = "v1"
DEFAULT_TOLERANCE_S = 300
"""Five minutes, the specification's recommendation and its libraries' default."""

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"

MAX_SIGNATURES = 16
"""A header with more entries than this is refused unread: verification cost stays bounded."""


class SecretFormatError(ValueError):
    """A signing secret that is not `whsec_` + base64 of at least one byte. Never holds the secret."""


class VerificationError(Exception):
    """A request whose signature headers do not verify. `reason` is a short, bounded label for metrics."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True, repr=False)
class SigningKey:
    """The key bytes of one secret. repr() never shows them."""

    key: bytes

    @classmethod
    def parse(cls, secret: str) -> SigningKey:
        """Parse `whsec_<base64>` (the prefix is optional, as in the reference libraries)."""
        encoded = secret.strip()
        if encoded.startswith(SECRET_PREFIX):
            encoded = encoded[len(SECRET_PREFIX):]
        try:
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise SecretFormatError("signing secret must be 'whsec_' followed by base64") from None
        if not key:
            raise SecretFormatError("signing secret is empty")
        return cls(key)

    def signature(self, webhook_id: str, timestamp: int, body: bytes) -> bytes:
        content = f"{webhook_id}.{timestamp}.".encode() + body
        return hmac.new(self.key, content, hashlib.sha256).digest()

    def __repr__(self) -> str:
        return "SigningKey(<hidden>)"


def parse_keys(secrets: Iterable[str]) -> tuple[SigningKey, ...]:
    keys = tuple(SigningKey.parse(s) for s in secrets)
    if not keys:
        raise SecretFormatError("at least one signing secret is required")
    return keys


def sign(keys: Sequence[SigningKey], webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of one delivery attempt, one signature per key."""
    signatures = " ".join(
        f"{SIGNATURE_VERSION}," + base64.b64encode(k.signature(webhook_id, timestamp, body)).decode("ascii")
        for k in keys
    )
    return {ID_HEADER: webhook_id, TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: signatures}


def verify(
        keys: Sequence[SigningKey],
        headers: Mapping[str, str],
        body: bytes,
        *,
        tolerance_s: int = DEFAULT_TOLERANCE_S,
        now: float | None = None,
) -> str:
    """Check the headers of a received request; return its webhook id or raise VerificationError.

    `headers` is looked up case-insensitively when it is a multidict (aiohttp); a plain dict must
    use the lowercase names.
    """
    webhook_id = headers.get(ID_HEADER)
    raw_timestamp = headers.get(TIMESTAMP_HEADER)
    raw_signatures = headers.get(SIGNATURE_HEADER)
    if not webhook_id or not raw_timestamp or not raw_signatures:
        raise VerificationError("missing-headers", "webhook-id, webhook-timestamp and webhook-signature are required")
    if len(webhook_id) > 256:
        raise VerificationError("bad-headers", "webhook-id is longer than 256 characters")
    try:
        timestamp = int(raw_timestamp)
    except ValueError:
        raise VerificationError("bad-headers", "webhook-timestamp must be integer unix seconds") from None
    current = time.time() if now is None else now
    if timestamp < current - tolerance_s:
        raise VerificationError("timestamp-too-old", f"webhook-timestamp is more than {tolerance_s}s in the past")
    if timestamp > current + tolerance_s:
        raise VerificationError("timestamp-too-new", f"webhook-timestamp is more than {tolerance_s}s in the future")
    entries = raw_signatures.split(" ")
    if len(entries) > MAX_SIGNATURES:
        raise VerificationError("bad-headers", f"more than {MAX_SIGNATURES} signatures")
    candidates: list[bytes] = []
    for entry in entries:
        version, _, encoded = entry.partition(",")
        if version != SIGNATURE_VERSION or not encoded:
            continue  # other schemes (v1a, ...) are allowed next to ours and ignored
        try:
            candidates.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            continue
    matched = False
    for key in keys:
        expected = key.signature(webhook_id, timestamp, body)
        for candidate in candidates:
            # No early exit: the time taken does not tell which key or entry matched.
            matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        raise VerificationError("bad-signature", "no webhook-signature entry matches a configured secret")
    return webhook_id
