"""The egress policy's address rules, URL vetting and allow-lists, without a network."""

from __future__ import annotations

import ipaddress

import pytest

from lading.delivery import egress

REFUSED = [
    ("10.0.0.1", "private"), ("172.16.5.4", "private"), ("192.168.0.1", "private"), ("127.0.0.1", "loopback"),
    ("127.255.0.9", "loopback"), ("169.254.169.254", "metadata"), ("169.254.1.1", "link-local"),
    ("100.64.0.1", "carrier-grade NAT"), ("100.127.255.254", "carrier-grade NAT"), ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"), ("239.255.255.250", "multicast"), ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"), ("192.0.0.8", "special-purpose"), ("198.18.0.1", "private"),
    ("192.0.2.1", "private"),
    ("::1", "loopback"), ("::", "unspecified"), ("fe80::1", "link-local"), ("fc00::1", "private"),
    ("fd12:3456::1", "private"), ("fd00:ec2::254", "metadata"), ("ff02::1", "multicast"),
    ("::ffff:127.0.0.1", "IPv6 form of 127.0.0.1"), ("::ffff:10.0.0.1", "IPv6 form of 10.0.0.1"),
    ("::ffff:169.254.169.254", "metadata"), ("2002:7f00:1::", "6to4 tunnel address (embeds 127.0.0.1, a loopback"),
    ("64:ff9b::a00:1", "IPv6 form of 10.0.0.1"),
]  # fmt: skip


@pytest.mark.parametrize(("address", "why"), REFUSED)
def test_non_global_and_special_addresses_are_refused_with_the_reason(address: str, why: str) -> None:
    reason = egress.refusal(ipaddress.ip_address(address))
    assert reason is not None and why in reason
    with pytest.raises(egress.EgressRefused, match="--egress-allow"):
        egress.EgressPolicy.check(ipaddress.ip_address(address), allowed=(), host=address)


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888", "::ffff:8.8.8.8", "93.184.216.34"])
def test_global_unicast_addresses_pass(address: str) -> None:
    assert egress.refusal(ipaddress.ip_address(address)) is None
    egress.EgressPolicy.check(ipaddress.ip_address(address), allowed=(), host=address)


def test_an_allow_listed_cidr_permits_its_addresses_and_their_ipv4_mapped_forms_only() -> None:
    allowed = egress.parse_cidrs(["10.20.0.0/16", "fd00::/8"])
    for address in ("10.20.1.1", "::ffff:10.20.1.1", "fd00::5"):
        egress.EgressPolicy.check(ipaddress.ip_address(address), allowed=allowed, host=address)
    for address in ("10.21.0.1", "127.0.0.1", "169.254.169.254"):
        with pytest.raises(egress.EgressRefused):
            egress.EgressPolicy.check(ipaddress.ip_address(address), allowed=allowed, host=address)


def test_metadata_is_refused_unless_explicitly_allowed() -> None:
    metadata = ipaddress.ip_address("169.254.169.254")
    with pytest.raises(egress.EgressRefused, match="metadata"):
        egress.EgressPolicy.check(metadata, allowed=egress.parse_cidrs(["10.0.0.0/8"]), host="m")
    egress.EgressPolicy.check(metadata, allowed=egress.parse_cidrs(["169.254.169.254/32"]), host="m")


def test_per_endpoint_allowances_add_to_the_global_list() -> None:
    policy = egress.EgressPolicy(
        allow=egress.parse_cidrs(["10.0.0.0/8"]), endpoint_allow={"acme/erp": egress.parse_cidrs(["127.0.0.0/8"])}
    )
    assert len(policy.allowance("acme/erp")) == 2
    assert policy.allowance("acme/other") == egress.parse_cidrs(["10.0.0.0/8"])


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://2130706433/", "non-canonical IPv4 form (of 127.0.0.1)"),
        ("http://0x7f.0.0.1/", "non-canonical IPv4 form"),
        ("http://0177.0.0.1/", "non-canonical IPv4 form"),
        ("http://127.1/", "non-canonical IPv4 form"),
        ("http://[::ffff:7f00:1]/", "IPv6 form of 127.0.0.1"),
        ("http://[fe80::1%25eth0]/", "link-local"),
        ("file:///etc/passwd", "not http or https"),
        ("gopher://8.8.8.8/", "not http or https"),
        ("http://user:pw@8.8.8.8/", "must not carry credentials"),
        ("http:///nohost", "no host"),
    ],
)
def test_vet_url_refuses_literals_odd_forms_and_other_schemes(url: str, message: str) -> None:
    with pytest.raises(egress.EgressRefused, match=message.replace("(", r"\(").replace(")", r"\)")):
        egress.vet_url(url, allowed=())


def test_vet_url_lets_names_through_to_the_resolver_and_never_echoes_the_path() -> None:
    assert egress.vet_url("https://erp.example.com/hook?token=s3cret", allowed=()).host == "erp.example.com"
    with pytest.raises(egress.EgressRefused) as refused:
        egress.vet_url("http://10.0.0.1/hook?token=s3cret", allowed=())
    assert "s3cret" not in str(refused.value) and "hook" not in str(refused.value)


def test_parse_cidrs_accepts_repeats_and_commas_and_names_a_bad_entry() -> None:
    assert len(egress.parse_cidrs(["10.0.0.0/8,192.168.1.1", " fd00::/8 "])) == 3
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33' is not a CIDR"):
        egress.parse_cidrs(["10.0.0.0/33"])
