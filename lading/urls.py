"""
URLs as errors, logs, statuses, Events and metrics may show them: never the user info, the query
or the fragment.

A presigned object-store URL carries its credential in the query (`X-Amz-Signature=…`,
`sig=…`), a basic-auth URL in its user info; both reach tenant-visible places (a job's
`last_error`, a batch's status, Events) and operator logs the moment an error message quotes
the URL. So every message that names a URL builds it with `redacted(url)`, and text that did
not come from us (an exception's `str()`, which aiohttp fills with the request URL) goes through
`scrub(text)` first, or is replaced by `describe(exc)`, which names only the exception's type and
its OS error.

    redacted("https://u:p@files.example:8443/m/a.txt?X-Amz-Signature=S#x")
        -> "https://files.example:8443/m/a.txt?…"
    host("https://u:p@files.example:8443/m/a.txt?sig=S") -> "files.example:8443"

Both never raise: a URL too malformed to parse shows as "<unparsable URL>", because an error
path that fails while describing its own error would hide the first one.
"""

from __future__ import annotations

import re
import urllib.parse

SHOWN_MAX = 200
"""Characters of a redacted URL kept in a message; a longer path is cut with '…'."""

UNPARSABLE = "<unparsable URL>"

_URL_IN_TEXT = re.compile(r"""[A-Za-z][A-Za-z0-9+.-]{1,15}://[^\s'"<>()\[\]{}]+(?:\[[^\]\s]*\][^\s'"<>(){}]*)?""")
"""A scheme://... run inside free text (exception messages), up to whitespace or a quote."""


def _split(url: str) -> urllib.parse.SplitResult | None:
    try:
        parts = urllib.parse.urlsplit(url.strip())
        _ = parts.port  # raises ValueError for a non-numeric or out-of-range port
    except ValueError:
        return None
    return parts


def host(url: str) -> str:
    """Host and port of `url` (no user info); UNPARSABLE when it cannot be parsed."""
    parts = _split(url)
    if parts is None:
        return UNPARSABLE
    name = parts.hostname or ""
    if ":" in name:
        name = f"[{name}]"
    return name if parts.port is None else f"{name}:{parts.port}"


def redacted(url: str) -> str:
    """scheme://host[:port]/path, with '?…' when there was a query; no user info, no fragment,
    at most SHOWN_MAX characters."""
    parts = _split(url)
    if parts is None:
        return UNPARSABLE
    shown = urllib.parse.urlunsplit((parts.scheme, host(url), parts.path, "", ""))
    if parts.query:
        shown += "?…"
    return shown if len(shown) <= SHOWN_MAX else shown[: SHOWN_MAX - 1] + "…"


def scrub(text: str) -> str:
    """`text` with every URL in it redacted, and anything after an '?' up to whitespace dropped
    when it looks like a query string (a URL printed without its scheme)."""
    scrubbed = _URL_IN_TEXT.sub(lambda m: redacted(m.group(0)), text)
    return re.sub(r"\?[^\s'\"?…]*=[^\s'\"]*", "?…", scrubbed)


def describe(exc: BaseException) -> str:
    """An exception as a message may show it when it is about a URL: its type and, for connection
    errors, the OS error's text; never its `str()`, which may quote the URL."""
    name = type(exc).__name__
    os_error = getattr(exc, "os_error", None)
    if isinstance(exc, OSError) and os_error is None:
        os_error = exc
    reason = getattr(os_error, "strerror", None)
    return f"{name} ({reason})" if isinstance(reason, str) and reason else name
