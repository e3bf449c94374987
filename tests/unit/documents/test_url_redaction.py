"""URLs as messages show them: no user info, query or fragment, and never an exception's own text."""

from __future__ import annotations

import aiohttp
import multidict
import pytest
import yarl

from lading import urls

SECRET_URL = "https://user:pass@files.example:8443/m/a.txt?X-Amz-Signature=SECRETSIG&X-Amz-Credential=AKIA#frag"


def test_redacted_keeps_scheme_host_port_and_path_only() -> None:
    assert urls.redacted(SECRET_URL) == "https://files.example:8443/m/a.txt?…"
    assert urls.host(SECRET_URL) == "files.example:8443"
    assert urls.redacted("http://[::1]:9000/x") == "http://[::1]:9000/x"


@pytest.mark.parametrize("url", ["http://h:99999/x?sig=SECRETSIG", "http://[::1/x?sig=SECRETSIG", "http://h:port/?sig=SECRETSIG"])
def test_malformed_urls_never_raise_and_never_show_their_query(url: str) -> None:
    assert "SECRETSIG" not in urls.redacted(url) and "SECRETSIG" not in urls.host(url)


def test_scrub_redacts_every_url_in_free_text() -> None:
    text = f"ClientResponseError: 404, message='Not Found', url='{SECRET_URL}' (then {SECRET_URL})"
    scrubbed = urls.scrub(text)
    assert "SECRETSIG" not in scrubbed and "pass" not in scrubbed and "AKIA" not in scrubbed
    assert "https://files.example:8443/m/a.txt?…" in scrubbed
    assert "SECRETSIG" not in urls.scrub("GET files.example/a.txt?X-Amz-Signature=SECRETSIG failed")


def test_describe_names_the_type_and_the_os_error_not_the_url() -> None:
    error = aiohttp.ClientResponseError(
        aiohttp.RequestInfo(yarl.URL(SECRET_URL), "GET", multidict.CIMultiDictProxy(multidict.CIMultiDict()),
                            yarl.URL(SECRET_URL)),
        (), status=500, message="x",
    )
    assert "SECRETSIG" in str(error)  # what aiohttp would have put into a message
    assert urls.describe(error) == "ClientResponseError"
    refused = ConnectionRefusedError(111, "Connection refused")
    assert urls.describe(refused) == "ConnectionRefusedError (Connection refused)"
