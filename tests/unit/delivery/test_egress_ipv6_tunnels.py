"""IPv6 tunnels (Teredo 2001::/32, 6to4 2002::/16) and translations (IPv4-mapped, NAT64) under the
egress policy: a tunnel is refused whatever it embeds, unless its IPv6 range is allow-listed."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import aiohttp.abc
import pytest

from lading.delivery import egress

TEREDO_GLOBAL = "2001:0:4136:e378:8000:63bf:3fff:fdd2"
"""RFC 4380's example: server 65.54.227.120, client 192.0.2.45 (obfuscated)."""
TEREDO_OF_GLOBAL_CLIENT = "2001:0:4136:e378:8000:63bf:f7f7:f7f7"
"""Server 65.54.227.120, client 8.8.8.8: both embedded addresses global."""


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("2002:808:808::1", "a 6to4 tunnel address (embeds 8.8.8.8)"),
        ("2002:7f00:1::1", "a 6to4 tunnel address (embeds 127.0.0.1, a loopback address)"),
        ("2002:a9fe:a9fe::", "embeds 169.254.169.254, a cloud metadata address"),
        (TEREDO_OF_GLOBAL_CLIENT, "a Teredo tunnel address (embeds 8.8.8.8)"),
        (TEREDO_GLOBAL, "a Teredo tunnel address (embeds 192.0.2.45"),
        ("2001::1", "a Teredo tunnel address"),
    ],
)
def test_tunnel_addresses_are_refused_even_when_what_they_embed_is_global(address: str, why: str) -> None:
    ip = ipaddress.ip_address(address)
    reason = egress.refusal(ip)
    assert reason is not None and why in reason
    with pytest.raises(egress.EgressRefused, match=r"refused: a .* tunnel address"):
        egress.EgressPolicy.check(ip, allowed=(), host=address)


def test_a_tunnel_literal_in_a_url_is_refused_before_any_connection() -> None:
    with pytest.raises(egress.EgressRefused, match="6to4 tunnel address"):
        egress.vet_url("http://[2002:808:808::1]:8080/hook?sig=x", allowed=())


def test_a_tunnel_is_allowed_only_by_a_range_that_holds_the_ipv6_address_itself() -> None:
    six_to_four = ipaddress.ip_address("2002:a00:1::1")  # embeds 10.0.0.1
    with pytest.raises(egress.EgressRefused, match="6to4"):
        egress.EgressPolicy.check(six_to_four, allowed=egress.parse_cidrs(["10.0.0.0/8"]), host="t")
    egress.EgressPolicy.check(six_to_four, allowed=egress.parse_cidrs(["2002:a00::/24"]), host="t")
    teredo = ipaddress.ip_address(TEREDO_OF_GLOBAL_CLIENT)
    with pytest.raises(egress.EgressRefused, match="Teredo"):
        egress.EgressPolicy.check(teredo, allowed=egress.parse_cidrs(["8.8.8.0/24", "65.54.0.0/16"]), host="t")
    egress.EgressPolicy.check(teredo, allowed=egress.parse_cidrs(["2001::/32"]), host="t")


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("::ffff:8.8.8.8", False), ("::ffff:127.0.0.1", True), ("::ffff:100.64.0.1", True),
        ("64:ff9b::808:808", False), ("64:ff9b::7f00:1", True), ("64:ff9b::a9fe:a9fe", True),
    ],
)  # fmt: skip
def test_translations_to_ipv4_are_judged_by_the_ipv4_address_they_reach(address: str, refused: bool) -> None:
    reason = egress.refusal(ipaddress.ip_address(address))
    assert (reason is not None) == refused, reason
    if refused:
        assert reason is not None and "IPv6 form of" in reason


def test_a_resolver_answer_with_a_tunnel_address_refuses_the_whole_answer() -> None:
    class Answers(aiohttp.abc.AbstractResolver):
        async def resolve(
                self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
        ) -> list[aiohttp.abc.ResolveResult]:
            return [
                {"hostname": host, "host": a, "port": port, "family": socket.AF_INET6, "proto": 0, "flags": 0}
                for a in ("2606:4700::1111", "2002:808:808::1")
            ]

        async def close(self) -> None:
            return None

    resolver = egress.VettingResolver(Answers())
    with pytest.raises(egress.EgressRefused, match=r"files\.example .*6to4 tunnel address"):
        asyncio.run(resolver.resolve("files.example", 443, socket.AF_INET6))
