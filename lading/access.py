"""
Bearer tokens of the HTTP intake (`lading api`): minting, the stored digest, lifetimes.

A token is `lading_` followed by 32 random bytes in base64url: printed once by `lading tokens
create`, never stored. The database keeps its SHA-256 (`api_tokens.token_sha256`), the namespaces it
may act in, and when it expires or was revoked (`lading.db.api_tokens`). A token is a credential of
its namespaces only: the intake answers 404 for anything elsewhere, exactly as for what does not
exist, so a token never learns whether another namespace's objects exist.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import secrets
from typing import Final

PREFIX: Final = "lading_"
"""Makes a leaked token recognisable to secret scanners."""
_TOKEN = re.compile(r"^lading_[A-Za-z0-9_-]{43}$")
_DURATION = re.compile(r"^(\d{1,6})([smhd])$")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
"""A token's name: a DNS-subdomain-like label of at most 63 characters (checked by the table too)."""


def mint() -> str:
    """A new random token."""
    return PREFIX + secrets.token_urlsafe(32)


def digest(token: str) -> str:
    """What is stored of a token and what a presented token is looked up by: its SHA-256, hex."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def well_formed(token: str) -> bool:
    """Whether `token` has a token's shape (checked before any database read)."""
    return _TOKEN.match(token) is not None


def parse_lifetime(text: str) -> dt.timedelta:
    """`30d`, `12h`, `45m`, `90s` -> a timedelta; a ValueError that names the accepted forms."""
    match = _DURATION.match(text.strip())
    if match is None or int(match[1]) == 0:
        raise ValueError(f"invalid lifetime {text!r}; expected a positive number with s, m, h or d, e.g. 30d")
    return dt.timedelta(seconds=int(match[1]) * _UNIT_S[match[2]])


def valid_name(name: str) -> bool:
    return len(name) <= 63 and re.match(NAME_PATTERN, name) is not None


def valid_namespace(namespace: str) -> bool:
    """A Kubernetes namespace name (DNS label)."""
    return len(namespace) <= 63 and re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", namespace) is not None
