"""
How much more work a pool's provider can take right now: the `headroom` signal of the scaler.

    vllm pool         GET <the pool's vLLM Service>/metrics  ->  parse_vllm_metrics  ->  vllm_headroom
                      (requests running and waiting, KV-cache use, summed over model_name/engine)
    external pool     the database (lading.db.registry.pool_signals): a pause in force, the
                      limiter's 429 cooldown, optionally the provider's x-ratelimit-remaining
                      share  ->  external_headroom

Everything returns a `scaling.Headroom` (a fraction 0..1, or None when unknown, plus a short reason
for the pool's status). A scrape that fails in any way (refused, timeout, not 200, too large, not
Prometheus text, no vLLM metric in it) gives None, never an exception: unknown headroom does not
stop scaling, the limits and the backlog still do. `scaling.decide` decides what the headroom
means for the worker count; this module only measures.

Where the metrics come from (`pool_vllm_load`): the pool's own Service, which the operator
rendered. The annotation `lading.dev/vllm-metrics-url` names another URL (an operator running
outside the cluster cannot reach the Service), but an annotation is written by whoever may edit
the pool, so it is honoured only when the operator runs with `--allow-vllm-metrics-override`,
and even then through the egress policy of deliveries (`lading.delivery.egress`: no loopback,
private, link-local or metadata address unless $LADING_EGRESS_ALLOW allows it; names vetted by
the resolver aiohttp connects through). An ignored or refused annotation is a Warning Event on
the pool (once per verdict, not once per scrape) and no request; URLs appear in logs and Events
only as `lading.urls.redacted` shows them.

The vLLM metric names are those of vLLM 0.6 - 0.10 (`vllm:num_requests_running`,
`vllm:num_requests_waiting`, `vllm:gpu_cache_usage_perc`, renamed `vllm:kv_cache_usage_perc` in the
V1 engine; both are fractions 0..1 despite the name).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import math

import aiohttp
import kopf
import prometheus_client.parser

from lading import urls
from lading.delivery import egress
from lading_operator import conditions, events, scaling

logger = logging.getLogger(__name__)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
"""Newer name first; a server exporting both is read once (the newer one)."""

METRICS_MAX_BYTES = 4 * 1024 * 1024
"""A vLLM /metrics page is ~50 KiB (histograms per model); more than this is not one."""
SCRAPE_TIMEOUT_S_DEFAULT = 3.0
"""Well inside the scaler's 15 s period; a model server slower than this is busy enough to count as unknown."""
KV_CACHE_FULL = 0.9
"""KV-cache use at which vLLM starts preempting sequences: no room for more."""
MAX_NUM_SEQS_DEFAULT = 256
"""vLLM's default --max-num-seqs, when the pool does not set engineArgs.maxNumSeqs."""
RATE_LIMIT_COOLDOWN_S = 60.0
"""After a 429 without a Retry-After still pending, add no workers for this long."""

METRICS_URL_ANNOTATION = "lading.dev/vllm-metrics-url"
"""Another URL for a pool's vLLM metrics; honoured only with `--allow-vllm-metrics-override`."""
METRICS_URL_IGNORED = conditions.METRICS_URL_IGNORED
METRICS_URL_REFUSED = conditions.METRICS_URL_REFUSED
"""Event reasons on the pool: the annotation was ignored (no override flag) or refused (egress)."""
REPORTED_MAX = 10_000
"""Pools whose last metrics-URL verdict is remembered (to post each verdict once); bounded."""


@dataclasses.dataclass(frozen=True)
class VllmLoad:
    """What one or more vLLM servers report, summed over their models and engines."""

    running: float
    waiting: float
    kv_cache_usage: float | None
    """Fraction 0..1 of the KV cache in use (the highest across engines); None if not exported."""

    def __add__(self, other: VllmLoad) -> VllmLoad:
        """Two replicas' loads together: requests add up, the fuller cache counts."""
        usages = [u for u in (self.kv_cache_usage, other.kv_cache_usage) if u is not None]
        return VllmLoad(
            running=self.running + other.running,
            waiting=self.waiting + other.waiting,
            kv_cache_usage=max(usages) if usages else None,
        )


def parse_vllm_metrics(text: str) -> VllmLoad:
    """Read the vLLM gauges from Prometheus text; ValueError when the text is not that."""
    sums: dict[str, float] = {}
    kv: dict[str, float] = {}
    try:
        for family in prometheus_client.parser.text_string_to_metric_families(text):
            for sample in family.samples:
                value = float(sample.value)
                if not math.isfinite(value):
                    continue
                if sample.name in (RUNNING, WAITING):
                    sums[sample.name] = sums.get(sample.name, 0.0) + max(value, 0.0)
                elif sample.name in KV_CACHE_USAGE:
                    kv[sample.name] = max(kv.get(sample.name, 0.0), min(max(value, 0.0), 1.0))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise ValueError(f"not Prometheus text: {type(exc).__name__}") from None
    if RUNNING not in sums and WAITING not in sums:
        raise ValueError(f"no {RUNNING} or {WAITING} in the metrics: not a vLLM server")
    usage = next((kv[name] for name in KV_CACHE_USAGE if name in kv), None)
    return VllmLoad(running=sums.get(RUNNING, 0.0), waiting=sums.get(WAITING, 0.0), kv_cache_usage=usage)


async def scrape_vllm(
        session: aiohttp.ClientSession,
        url: str,
        *,
        timeout_s: float = SCRAPE_TIMEOUT_S_DEFAULT,
        max_bytes: int = METRICS_MAX_BYTES,
) -> VllmLoad | None:
    """GET `url` (a vLLM `/metrics`) and parse it; None on any failure (logged, bounded)."""
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url, allow_redirects=False) as response:
                if response.status != 200:
                    logger.info("vLLM metrics at %s: HTTP %d", urls.redacted(url), response.status)
                    return None
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.content.iter_chunked(64 * 1024):
                    size += len(chunk)
                    if size > max_bytes:
                        logger.info("vLLM metrics at %s: larger than %d bytes", urls.redacted(url), max_bytes)
                        return None
                    chunks.append(chunk)
                body = b"".join(chunks)
    except TimeoutError:
        logger.info("vLLM metrics at %s: no answer within %.1fs", urls.redacted(url), timeout_s)
        return None
    except egress.EgressRefused:
        raise  # the caller reports it on the pool
    except (aiohttp.ClientError, OSError) as exc:
        refused = egress.find_refusal(exc)
        if refused is not None:
            raise refused from None
        logger.info("vLLM metrics at %s: %s", urls.redacted(url), urls.describe(exc))
        return None
    try:
        return parse_vllm_metrics(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        logger.info("vLLM metrics at %s: %s", urls.redacted(url), str(exc)[:200])
        return None


_reported: dict[str, str] = {}
"""Pool uid -> the last metrics-URL verdict posted as an Event (each posted once, not per scrape)."""


def _report(body: kopf.Body, *, reason: str, message: str) -> None:
    uid = str(body.metadata.uid or f"{body.metadata.namespace}/{body.metadata.name}")
    verdict = f"{reason}: {message}"
    if _reported.get(uid) == verdict:
        return
    if len(_reported) >= REPORTED_MAX:
        _reported.clear()
    _reported[uid] = verdict
    logger.warning("InferencePool %s/%s: %s", body.metadata.namespace, body.metadata.name, message)
    events.warning(body, reason=reason, message=message)


async def pool_vllm_load(
        session: aiohttp.ClientSession,
        *,
        body: kopf.Body,
        service_url: str,
        override: bool,
        egress_allow: tuple[str, ...] = (),
        timeout_s: float = SCRAPE_TIMEOUT_S_DEFAULT,
) -> VllmLoad | None:
    """The load of a vllm pool from its own Service's metrics (`service_url`, rendered by the
    operator), or from the annotation's URL when `override` (--allow-vllm-metrics-override) and
    the egress policy allow it. None when unknown; an ignored or refused annotation is reported
    on the pool and nothing is requested from it."""
    annotated = (body.metadata.annotations or {}).get(METRICS_URL_ANNOTATION)
    if not annotated:
        _reported.pop(str(body.metadata.uid), None)
        return await scrape_vllm(session, service_url, timeout_s=timeout_s)
    shown = urls.redacted(annotated)
    if not override:
        _report(
            body, reason=METRICS_URL_IGNORED,
            message=f"annotation {METRICS_URL_ANNOTATION} ({shown}) ignored: the operator runs without "
            "--allow-vllm-metrics-override; the pool's Service is scraped",
        )  # fmt: skip
        return await scrape_vllm(session, service_url, timeout_s=timeout_s)
    allowed = egress.parse_cidrs(egress_allow)
    try:
        egress.vet_url(annotated, allowed=allowed)
        token = egress.allowing(allowed)
        try:
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(resolver=egress.VettingResolver(), use_dns_cache=False),
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            ) as vetted:
                load = await scrape_vllm(vetted, annotated, timeout_s=timeout_s)
        finally:
            egress.reset(token)
    except egress.EgressRefused as exc:
        _report(
            body, reason=METRICS_URL_REFUSED,
            message=f"annotation {METRICS_URL_ANNOTATION} ({shown}) not scraped: {exc}; headroom unknown",
        )  # fmt: skip
        return None
    _reported.pop(str(body.metadata.uid), None)
    return load


def vllm_headroom(
        load: VllmLoad | None,
        *,
        max_num_seqs: int | None,
        replicas: int = 1,
) -> scaling.Headroom:
    """Headroom of `replicas` vLLM servers whose summed load is `load`.

        waiting > 0                  -> 0    the scheduler is already queueing
        KV cache >= KV_CACHE_FULL    -> 0    more sequences would be preempted
        otherwise                    -> min(1 - running/(maxNumSeqs·replicas), 1 - KV/KV_CACHE_FULL)
    """
    if load is None:
        return scaling.Headroom.unknown("vLLM metrics unavailable")
    seqs = (max_num_seqs or MAX_NUM_SEQS_DEFAULT) * max(replicas, 1)
    kv_text = "" if load.kv_cache_usage is None else f", KV cache {load.kv_cache_usage:.0%}"
    if load.waiting > 0:
        return scaling.Headroom(0.0, f"vLLM: {load.waiting:.0f} requests waiting{kv_text}")
    if load.kv_cache_usage is not None and load.kv_cache_usage >= KV_CACHE_FULL:
        return scaling.Headroom(0.0, f"vLLM: KV cache {load.kv_cache_usage:.0%} used")
    fraction = 1.0 - load.running / seqs
    if load.kv_cache_usage is not None:
        fraction = min(fraction, 1.0 - load.kv_cache_usage / KV_CACHE_FULL)
    fraction = min(max(fraction, 0.0), 1.0)
    return scaling.Headroom(fraction, f"vLLM: {load.running:.0f} of {seqs} sequences running{kv_text}")


def engine_not_ready(*, ready: int, desired: int) -> scaling.Headroom:
    """A vllm pool whose model server has no ready replica: workers would only fail to connect."""
    return scaling.Headroom(0.0, f"vLLM not ready ({ready}/{desired} replicas)")


def external_headroom(
        *,
        now: dt.datetime,
        paused_until: dt.datetime | None = None,
        paused_reason: str | None = None,
        cooldown_until: dt.datetime | None = None,
        last_rate_limited_at: dt.datetime | None = None,
        remaining_fraction: float | None = None,
) -> scaling.Headroom:
    """Headroom of an external (OpenAI-compatible) provider from what the workers recorded.

    - a pause in force (key refused, quota spent: lading.db pools.paused_until) -> 0;
    - the pool's 429 cooldown (pools.cooldown_until, set by the limiter) in force -> 0;
    - a 429 in the last RATE_LIMIT_COOLDOWN_S -> 0;
    - the provider's rate-limit headers (remaining / limit), when known -> that share;
    - otherwise unknown: nothing says the provider is full.
    """
    if paused_until is not None and paused_until > now:
        left = (paused_until - now).total_seconds()
        why = f": {paused_reason[:80]}" if paused_reason else ""
        return scaling.Headroom(0.0, f"pool paused for {left:.0f}s{why}")
    if cooldown_until is not None and cooldown_until > now:
        left = (cooldown_until - now).total_seconds()
        return scaling.Headroom(0.0, f"429 cooldown, {left:.0f}s left")
    if last_rate_limited_at is not None:
        since = (now - last_rate_limited_at).total_seconds()
        if since < RATE_LIMIT_COOLDOWN_S:
            return scaling.Headroom(0.0, f"429 from the provider {max(since, 0.0):.0f}s ago")
    if remaining_fraction is not None and math.isfinite(remaining_fraction):
        fraction = min(max(remaining_fraction, 0.0), 1.0)
        return scaling.Headroom(fraction, f"rate limit {fraction:.0%} left")
    return scaling.Headroom.unknown("no recent 429")
