"""
Egress policy of the dispatcher: which addresses a delivery may connect to (SSRF defence).

Only registered DeliveryEndpoints are ever called, and their URLs come from the `endpoints`
table, never from a result or a document. Still, a URL (or the DNS answer for its host) can
point inside the cluster: at the cloud metadata service, the Kubernetes API, a database. So
every address is vetted at send time, and the connection goes to exactly the address that
was vetted:

    URL ──vet_url()──▶ literal IP? vet it          (aiohttp connects to literals directly)
                        host name? ──▶ VettingResolver.resolve() vets every address it returns,
                                       and aiohttp's connector connects only to those

The connector runs without a DNS cache, so each attempt resolves afresh and no answer vetted
for one endpoint is reused for another; there is no window between vetting and connecting
in which a rebinding DNS server could swap the address.

Refused unless allow-listed: loopback, private (RFC 1918, ULA fc00::/7), link-local,
CGNAT (100.64.0.0/10), multicast, unspecified, reserved and every other non-global range,
cloud metadata (169.254.169.254, fd00:ec2::254), IPv4 written in legacy numeric forms
(http://2130706433/, http://0x7f.1/), IPv6 translations of a refused IPv4 address
(IPv4-mapped ::ffff:127.0.0.1, NAT64 64:ff9b::/96), and the IPv6 tunnels Teredo (2001::/32)
and 6to4 (2002::/16) whatever IPv4 address they embed: a tunnel's far end is a relay the policy
cannot see past. A refusal of a form that embeds an IPv4 address names that address too.
`--egress-allow CIDR` (repeatable; `LADING_EGRESS_ALLOW` comma-separated) allows ranges for
every endpoint (a tunnel only by a range holding its IPv6 address); `lading run` allows loopback for the
endpoints it serves itself, and for those only (`Allowance`, per endpoint).
"""

from __future__ import annotations

import contextvars
import dataclasses
import ipaddress
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import aiohttp
import aiohttp.abc
import yarl

from lading import errors

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ENV_VAR: Final = "LADING_EGRESS_ALLOW"
"""Comma-separated CIDRs the worker may connect to although they are not global (operator-rendered)."""

METADATA: Final = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})
"""Cloud instance metadata services: credentials live there."""

_CGNAT: Final = ipaddress.ip_network("100.64.0.0/10")
_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")
_TEREDO: Final = ipaddress.ip_network("2001::/32")
_SIX_TO_FOUR: Final = ipaddress.ip_network("2002::/16")
_SPECIAL: Final = tuple(
    ipaddress.ip_network(n)
    for n in ("192.0.0.0/24", "192.0.2.0/24", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24",
              "2001:db8::/32", "100::/64", "2001::/23")
)
"""IETF special-purpose ranges (protocol assignments, documentation, benchmarking) that some Python
versions count as global: refused whatever the interpreter thinks."""
_SCHEMES: Final = frozenset({"http", "https"})


class EgressRefused(errors.PermanentError, OSError):
    """A delivery's URL or resolved address is not allowed. The message names the host and why,
    never the URL's path or query (they may carry tokens)."""


def parse_cidrs(values: Iterable[str]) -> tuple[IPNetwork, ...]:
    """CIDRs (or single addresses) from flags or the environment; ValueError names a bad one."""
    networks: list[IPNetwork] = []
    for raw in values:
        for item in (part.strip() for part in raw.split(",")):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ValueError(f"{item!r} is not a CIDR such as 10.0.0.0/8 or fd00::/8") from None
    return tuple(networks)


def _translated_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv4-mapped or NAT64 address reaches: vetted (and allowed) as that one."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _tunnel(ip: ipaddress.IPv6Address) -> tuple[str, tuple[ipaddress.IPv4Address, ...]] | None:
    """('Teredo' or '6to4', the IPv4 addresses it embeds) for a tunnel address, else None."""
    if ip in _TEREDO:
        server, client = ip.teredo or (ipaddress.IPv4Address(0), ipaddress.IPv4Address(0))
        return "Teredo", (client, server)
    if ip in _SIX_TO_FOUR:
        return "6to4", (ip.sixtofour or ipaddress.IPv4Address(0),)
    return None


def _v4_refusal(ip: ipaddress.IPv4Address) -> str | None:
    if ip in METADATA:
        return "a cloud metadata address"
    if ip.is_unspecified:
        return "the unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip in _CGNAT:
        return "a carrier-grade NAT address (100.64.0.0/10)"
    if ip.is_reserved:
        return "a reserved address"
    if ip.is_private:
        return "a private address"
    if not ip.is_global or any(ip in n for n in _SPECIAL if n.version == 4):
        return "a special-purpose or non-global address"
    return None


def refusal(ip: IPAddress) -> str | None:
    """Why the default policy refuses `ip`, or None when it is a global unicast address."""
    if isinstance(ip, ipaddress.IPv4Address):
        return _v4_refusal(ip)
    if ip.scope_id:
        ip = ipaddress.IPv6Address(str(ip).split("%", 1)[0])
    if ip in METADATA:
        return "a cloud metadata address"
    tunnel = _tunnel(ip)
    if tunnel is not None:
        kind, inside = tunnel
        embedded = next(((v4, why) for v4 in inside if (why := _v4_refusal(v4)) is not None), None)
        if embedded is not None:
            return f"a {kind} tunnel address (embeds {embedded[0]}, {embedded[1]})"
        return f"a {kind} tunnel address (embeds {inside[0]})"
    translated = _translated_v4(ip)
    if translated is not None:
        why = _v4_refusal(translated)
        return None if why is None else f"an IPv6 form of {translated}, {why}"
    if ip.is_unspecified:
        return "the unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_private:
        return "a private address"
    if ip.is_reserved or not ip.is_global or any(ip in n for n in _SPECIAL if n.version == 6):
        return "a reserved, special-purpose or non-global address"
    return None


@dataclasses.dataclass(frozen=True)
class EgressPolicy:
    """Global allow-list plus per-endpoint extras. Everything else non-global is refused."""

    allow: tuple[IPNetwork, ...] = ()
    """Allowed for every endpoint (`--egress-allow`)."""
    endpoint_allow: Mapping[str, tuple[IPNetwork, ...]] = dataclasses.field(default_factory=dict)
    """Allowed for the named endpoints only (`lading run` allows loopback for the receiver it serves)."""

    def allowance(self, endpoint: str) -> tuple[IPNetwork, ...]:
        return self.allow + self.endpoint_allow.get(endpoint, ())

    @staticmethod
    def check(ip: IPAddress, *, allowed: Sequence[IPNetwork], host: str) -> None:
        """Raise EgressRefused unless `ip` is global or inside an allowed network."""
        plain: IPAddress = ip
        if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
            plain = ipaddress.IPv6Address(str(ip).split("%", 1)[0])
        candidates: list[IPAddress] = [plain]
        if isinstance(plain, ipaddress.IPv6Address):
            # A tunnel is allowed only by a range holding the IPv6 address itself: allowing an
            # IPv4 range does not allow whatever relay a 6to4 or Teredo address leads through.
            translated = _translated_v4(plain)
            if translated is not None:
                candidates.append(translated)
        if any(c.version == n.version and c in n for c in candidates for n in allowed):
            return
        why = refusal(plain)
        if why is not None:
            shown = f"{host} ({plain})" if host != str(plain) else str(plain)
            raise EgressRefused(f"egress to {shown} refused: {why}; allow it with --egress-allow if intended")


_ALLOWANCE: contextvars.ContextVar[tuple[IPNetwork, ...]] = contextvars.ContextVar("lading_egress_allowance")
"""The allow-list of the endpoint being called now, seen by the resolver inside aiohttp's connect."""


def allowing(networks: tuple[IPNetwork, ...]) -> contextvars.Token[tuple[IPNetwork, ...]]:
    """Set the allow-list for the calls of the current task (reset with `_ALLOWANCE.reset(token)`)."""
    return _ALLOWANCE.set(networks)


def reset(token: contextvars.Token[tuple[IPNetwork, ...]]) -> None:
    _ALLOWANCE.reset(token)


def _legacy_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """An IPv4 address written in a form other than canonical dotted decimal (2130706433, 0x7f.1, 0177.0.0.1)."""
    if not host or any(c not in "0123456789abcdefxABCDEFX." for c in host):
        return None
    try:
        packed = socket.inet_aton(host)
    except OSError:
        return None
    ip = ipaddress.IPv4Address(packed)
    return None if str(ip) == host else ip


def vet_url(url: str, *, allowed: Sequence[IPNetwork]) -> yarl.URL:
    """Parse an endpoint URL for sending: http(s) only, with a host; a literal address is vetted
    here (aiohttp connects to literals without asking the resolver). EgressRefused says why not."""
    try:
        parsed = yarl.URL(url)
    except (ValueError, TypeError):
        raise EgressRefused("the endpoint URL cannot be parsed") from None
    if parsed.scheme not in _SCHEMES:
        raise EgressRefused(f"the endpoint URL's scheme {parsed.scheme!r} is not http or https")
    host = parsed.raw_host
    if not host:
        raise EgressRefused("the endpoint URL has no host")
    if parsed.user is not None or parsed.password is not None:
        raise EgressRefused("the endpoint URL must not carry credentials")
    legacy = _legacy_ipv4(host)
    if legacy is not None:
        raise EgressRefused(f"egress to {host} refused: a non-canonical IPv4 form (of {legacy})")
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return parsed  # a name: the resolver vets what it resolves to
    EgressPolicy.check(literal, allowed=allowed, host=host)
    return parsed


class VettingResolver(aiohttp.abc.AbstractResolver):
    """Resolves with `inner` (the system resolver by default) and refuses the whole answer if any
    address in it is not allowed for the endpoint being called (see `allowing`). aiohttp then
    connects to the returned, vetted addresses only."""

    def __init__(self, inner: aiohttp.abc.AbstractResolver | None = None) -> None:
        self._inner = inner if inner is not None else aiohttp.ThreadedResolver()

    async def resolve(
            self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        allowed = _ALLOWANCE.get(())
        answers = await self._inner.resolve(host, port, family)
        if not answers:
            raise EgressRefused(f"{host} did not resolve to any address")
        for answer in answers:
            try:
                ip = ipaddress.ip_address(answer["host"])
            except ValueError:
                raise EgressRefused(f"{host} resolved to something that is not an address") from None
            EgressPolicy.check(ip, allowed=allowed, host=host)
        return answers

    async def close(self) -> None:
        await self._inner.close()


def find_refusal(exc: BaseException) -> EgressRefused | None:
    """The EgressRefused behind an aiohttp connection error (it wraps what the resolver raised)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, EgressRefused):
            return current
        seen.add(id(current))
        nested: Any = getattr(current, "os_error", None)
        current = nested if isinstance(nested, BaseException) else (current.__cause__ or current.__context__)
    return None
