"""
The figures of a scenario, derived from its history alone (history.py), Jepsen-style.

Must-be-zero figures (MUST_BE_ZERO) are safety: one violation fails the run, however rare.
The others are reported: how much the faults cost (redeliveries, reclaims, recovery times,
throughput) and what was injected. An ambiguous outcome (a delivery left UNKNOWN_EXTERNAL: the ERP
may or may not have applied it) is Jepsen's `:info`: it is counted as `info`, never as lost and
never as duplicated.

Definitions (each over the scenario's batches, at the end of the scenario, after the drain):

    lost                    documents asked for with no job, plus jobs not in a terminal state
    duplicate_jobs          (batch, document key) with more than one job row
    unexpected              jobs of the scenario's batches for a key nobody asked for
    undelivered             SUCCEEDED jobs whose delivery is neither DELIVERED nor UNKNOWN_EXTERNAL
    lost_effects            deliveries DELIVERED with no row in the ERP's inbox (a 2xx without a commit)
    duplicate_effects       ERP inbox rows accepted per job beyond one, plus ledger bookings per job
                            beyond one (the business intent: one invoice booked once)
    stale_overwrites_applied  results written by a fence that is not the job's last, plus attempts
                            that finished `ok` under a fence that was superseded
    retry_after_violations  a job's attempt begun before a Retry-After it had been given ran out, plus
                            requests that reached the model during a pool's Retry-After window
                            once the pool's cooldown was committed (seen by the recorder), beyond
                            GRACE_S after that; a request a SIGSTOPped worker had in hand and sent
                            within GRACE_S of its SIGCONT is one granted before, not a violation
    attempts_after_deadline attempts begun after their job's deadline
    limiter_overshoot_*     what the model saw beyond the pool's limits: most requests and tokens in
                            any 60 s window, most requests at once, and its own limit refusals
                            (over the model's whole log, streamed while the scenario ran)
    model_log_missed        requests the model saw that the streamed log lost (the stub keeps only
                            its last 10,000): non-zero means the figures above are not proven
    events_unpublished      outbox rows of the scenario still unpublished after the drain
    events_never_delivered  events marked published that reached neither the side queue nor the inbox
    status_regressions      a job seen going back: its fence decreasing, or a final state left (a
                            reviewer's decision on REVIEW_REQUIRED is not a regression; an attempt
                            given back after a 429 lowers `attempt` by design and is not one either)
    recovery_over_bound     jobs held by a killed, stopped or cut-off worker that were not free again
                            (attempt expired by the reaper or finished, or another attempt begun)
                            within lease TTL + reaper interval + first backoff (+ SLACK_S)
    outcome_violations      what the scenario's fault must lead to (`expect` in the history) and did
                            not: a job of a deadline batch not FAILED_TERMINAL for its deadline; a job
                            of a deleted batch neither CANCELLED nor ended before the cancellation, a
                            cancelled job with a result or a delivery, a deleted batch's object left,
                            its cancellation reported by more than one Event; a failpoint kill that
                            did not happen

Reported with them: `deadlines_passed` (jobs whose deadline passed before the scenario ended: the
deadline fault was real), `cancelled`.
"""

from __future__ import annotations

import collections
import itertools
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

TERMINAL = frozenset({"SUCCEEDED", "FAILED_TERMINAL", "CANCELLED", "REVIEW_REQUIRED"})
FINAL = frozenset({"SUCCEEDED", "FAILED_TERMINAL", "CANCELLED"})
"""States nothing but a reviewer leaves (REVIEW_REQUIRED waits for one, so it is terminal for the
pipeline but may still move)."""
GRACE_S = 1.5
"""Requests granted before a 429 was answered and committed as the pool's cooldown may still land
in its window: the model's answer, the worker's commit and the other workers' next claim take up to
this long on a busy two-core machine."""
TOLERANCE_S = 0.05
"""Clock granularity between the database's timestamps of two attempts."""
SLACK_S = 2.0
"""Recovery-time slack over the bound: a claimer's poll, a free slot, and scheduling on two cores."""

MUST_BE_ZERO = (
    "lost", "duplicate_jobs", "unexpected", "undelivered", "lost_effects", "duplicate_effects",
    "stale_overwrites_applied", "retry_after_violations", "attempts_after_deadline",
    "limiter_overshoot_requests", "limiter_overshoot_tokens", "limiter_overshoot_concurrency",
    "limiter_refusals", "model_log_missed", "events_unpublished", "events_never_delivered", "status_regressions",
    "recovery_over_bound", "outcome_violations",
)  # fmt: skip
REPORTED = (
    "documents", "jobs", "succeeded", "review", "failed", "cancelled", "deadlines_passed", "info", "delivered",
    "delivery_retries", "stale_rejections", "reclaims", "max_attempts_seen", "kills", "faults",
    "recovery_p50_s", "recovery_max_s", "recovery_bound_s", "reclaim_max_s", "duration_s", "throughput_jobs_s",
)  # fmt: skip


def check(history: Mapping[str, Any]) -> dict[str, Any]:
    final = history["final"]
    batches = set(history["submitted"])
    jobs = [j for j in final["jobs"] if j["batch"] in batches]
    job_ids = {j["id"] for j in jobs}
    by_id = {j["id"]: j for j in jobs}
    attempts = [a for a in final["attempts"] if a["job_id"] in job_ids]
    deliveries = [d for d in final["deliveries"] if d["job_id"] in job_ids]
    figures: dict[str, Any] = {}

    # --- Jobs: lost, duplicated, unexpected.
    keys = collections.Counter((j["batch"], j["key"]) for j in jobs)
    asked = {(b, k) for b, ks in history["submitted"].items() for k in ks}
    deleted = set(history.get("deleted_batches", []))
    missing = [bk for bk in asked if bk not in keys and bk[0] not in deleted]
    stuck = [j for j in jobs if j["state"] not in TERMINAL]
    figures["documents"] = len(asked)
    figures["jobs"] = len(jobs)
    figures["lost"] = len(missing) + len(stuck)
    figures["duplicate_jobs"] = sum(n - 1 for n in keys.values() if n > 1)
    figures["unexpected"] = sum(1 for bk in keys if bk not in asked)
    states = collections.Counter(j["state"] for j in jobs)
    figures["succeeded"] = states["SUCCEEDED"]
    figures["review"] = states["REVIEW_REQUIRED"]
    figures["failed"] = states["FAILED_TERMINAL"]
    figures["cancelled"] = states["CANCELLED"]

    # --- Deliveries and ERP effects.
    delivery_by_job: dict[int, list[Mapping[str, Any]]] = collections.defaultdict(list)
    for d in deliveries:
        delivery_by_job[d["job_id"]].append(d)
    erp_inbox = {r["delivery_id"]: r for r in final["erp_inbox"]}
    figures["undelivered"] = sum(
        1 for j in jobs if j["state"] == "SUCCEEDED"
        and not any(d["state"] in ("DELIVERED", "UNKNOWN_EXTERNAL") for d in delivery_by_job[j["id"]])
    )  # fmt: skip
    figures["info"] = sum(1 for d in deliveries if d["state"] == "UNKNOWN_EXTERNAL")
    figures["delivered"] = sum(1 for d in deliveries if d["state"] == "DELIVERED")
    figures["lost_effects"] = sum(
        1 for d in deliveries if d["state"] == "DELIVERED" and d["delivery_id"] not in erp_inbox
    )  # fmt: skip
    accepted_per_job = collections.Counter(
        d["job_id"] for d in deliveries if erp_inbox.get(d["delivery_id"], {}).get("status") == "accepted"
    )
    ledger_per_job = collections.Counter(
        int(r["lading_job_id"]) for r in final["ledger"] if str(r["lading_job_id"]).isdigit()
        and int(r["lading_job_id"]) in job_ids
    )  # fmt: skip
    figures["duplicate_effects"] = sum(n - 1 for n in accepted_per_job.values() if n > 1) + sum(
        n - 1 for n in ledger_per_job.values() if n > 1
    )
    delivery_ids = {d["delivery_id"] for d in deliveries}
    sends = sum(1 for a in final["delivery_attempts"] if a["delivery_id"] in delivery_ids)
    figures["delivery_retries"] = max(0, sends - len(delivery_ids))

    # --- Fences.
    result_fence = {r["job_id"]: r["fence"] for r in final["results"] if r["job_id"] in job_ids}
    overwrites = sum(1 for job_id, fence in result_fence.items() if fence != by_id[job_id]["fence"])
    overwrites += sum(1 for a in attempts if a["outcome"] == "ok" and a["fence"] != by_id[a["job_id"]]["fence"])
    figures["stale_overwrites_applied"] = overwrites
    figures["stale_rejections"] = sum(1 for s in final["stale"] if s["job_id"] in job_ids)
    figures["reclaims"] = sum(1 for a in attempts if a["outcome"] == "lease-expired")
    per_job = collections.Counter(a["job_id"] for a in attempts)
    figures["max_attempts_seen"] = max(per_job.values(), default=0)

    # --- Deadlines and Retry-After.
    figures["attempts_after_deadline"] = sum(
        1 for a in attempts if a["started"] > by_id[a["job_id"]]["deadline"] + TOLERANCE_S
    )  # fmt: skip
    figures["retry_after_violations"] = _job_retry_after_violations(attempts, history) + _model_retry_after_violations(
        history
    )

    # --- What the model saw.
    model = history.get("model") or {}
    limits = model.get("limits") or {}
    stats = model.get("stats") or {}
    figures["limiter_overshoot_requests"] = max(0, _most_in_window(stats.get("admitted", []), count=True)
                                                - limits.get("rpm", 10**12))  # fmt: skip
    figures["limiter_overshoot_tokens"] = max(0, _most_in_window(stats.get("admitted", []), count=False)
                                              - limits.get("tpm", 10**15))  # fmt: skip
    figures["limiter_overshoot_concurrency"] = max(0, stats.get("max_concurrent", 0) - limits.get("concurrency", 10**9))
    figures["limiter_refusals"] = sum((stats.get("refusals") or {}).values())
    figures["model_log_missed"] = int(stats.get("log_missed", 0))

    # --- Events.
    window = (history["started"] - 1.0, history["ended"] + 1.0)
    outbox = [e for e in final["outbox"] if window[0] <= e["created"] <= window[1]]
    delivered_events = set(history["events_seen"]) | {r["event_id"] for r in final["inbox"]}
    figures["events_unpublished"] = sum(1 for e in outbox if e["published"] is None)
    figures["events_never_delivered"] = sum(
        1 for e in outbox if e["published"] is not None and e["event_id"] not in delivered_events
    )  # fmt: skip

    # --- Status regressions, from the polled observations and the final rows.
    figures["status_regressions"] = _regressions(history["observations"], jobs)

    # --- Recovery after each kill, stop or cut.
    recoveries, reclaim_times, over = _recoveries(history, attempts)
    bound = history["bounds"].get("recovery_s", 0.0)
    figures["recovery_over_bound"] = over
    figures["recovery_p50_s"] = round(statistics.median(recoveries), 2) if recoveries else None
    figures["recovery_max_s"] = round(max(recoveries), 2) if recoveries else None
    figures["recovery_bound_s"] = round(bound + SLACK_S, 2)
    figures["reclaim_max_s"] = round(max(reclaim_times), 2) if reclaim_times else None

    # --- What the scenario's fault must lead to.
    figures["outcome_violations"] = _outcome_violations(history, jobs, deliveries, result_fence)
    figures["deadlines_passed"] = sum(1 for j in jobs if j["deadline"] < history["ended"])

    # --- Faults and time.
    figures["kills"] = len(history["kills"])
    figures["faults"] = len(history["faults"])
    figures["duration_s"] = round(history["ended"] - history["started"], 1)
    finished = [j["finished"] for j in jobs if j["finished"] is not None]
    created = [j["created"] for j in jobs]
    span = (max(finished) - min(created)) if finished and created else 0.0
    figures["throughput_jobs_s"] = round(len(finished) / span, 1) if span > 0 else None
    return figures


def _outcome_violations(
        history: Mapping[str, Any],
        jobs: list[Mapping[str, Any]],
        deliveries: list[Mapping[str, Any]],
        results: Mapping[int, int],
) -> int:
    expect = history.get("expect") or {}
    count = 0
    for job in jobs:
        if job["batch"] in expect.get("deadline_batches", ()):
            count += job["state"] != "FAILED_TERMINAL" or "DEADLINE" not in (job["error"] or "")
    delivered = {d["job_id"] for d in deliveries}
    for batch in expect.get("cancelled_batches", ()):
        of_batch = [j for j in jobs if j["batch"] == batch]
        cancelled = [j for j in of_batch if j["state"] == "CANCELLED"]
        cancelled_at = min((j["finished"] for j in cancelled), default=None)
        for job in of_batch:
            if job["state"] == "CANCELLED":
                count += (job["id"] in results) + (job["id"] in delivered)  # nothing extracted nor sent after
            elif not (job["state"] in TERMINAL and job["finished"] is not None
                      and (cancelled_at is None or job["finished"] <= cancelled_at + TOLERANCE_S)):  # fmt: skip
                count += 1  # left running, or finished after its batch was cancelled
        reports = [e for e in history.get("kube_events", []) if e["object"] == batch and e["reason"] == "Cancelled"]
        count += max(0, len(reports) - 1)
        count += sum(1 for f in history["faults"] if f["kind"] == "deletion-not-converged" and f["target"] == batch)
    if "failpoint_kills" in expect:
        done = sum(1 for k in history["kills"] if str(k.get("signal", "")).startswith("failpoint "))
        count += abs(expect["failpoint_kills"] - done)
    return int(count)


def violations(figures: Mapping[str, Any]) -> dict[str, Any]:
    return {name: figures[name] for name in MUST_BE_ZERO if figures.get(name)}


def _job_retry_after_violations(attempts: Iterable[Mapping[str, Any]], history: Mapping[str, Any]) -> int:
    """A job's next attempt begun before the Retry-After of its rate-limited attempt ran out."""
    storms = [f for f in history["faults"] if f["kind"] == "model-429"]
    if not storms:
        return 0
    by_job: dict[int, list[Mapping[str, Any]]] = collections.defaultdict(list)
    for a in attempts:
        by_job[a["job_id"]].append(a)
    count = 0
    for series in by_job.values():
        series.sort(key=lambda a: a["fence"])
        for before, after in itertools.pairwise(series):
            if before["error_class"] != "RATE_LIMITED" or before["finished"] is None:
                continue
            retry_after = _retry_after_at(storms, before["finished"])
            if retry_after is not None and after["started"] < before["finished"] + retry_after - TOLERANCE_S - 1.0:
                # Retry-After has whole seconds: the model's 429 was answered up to a second before
                # the attempt's end was recorded, so the bound is (answer + Retry-After) - 1 s at worst.
                count += 1
    return count


def _retry_after_at(storms: Iterable[Mapping[str, Any]], at: float) -> float | None:
    for storm in storms:
        if storm["start"] - 1.0 <= at <= (storm["end"] or at) + storm["retry_after"] + 5.0:
            return float(storm["retry_after"])
    return None


def _model_retry_after_violations(history: Mapping[str, Any]) -> int:
    """Requests that reached the model inside a Retry-After window it had answered, later than
    GRACE_S after the pool's cooldown for it was committed (requests granted before that may still
    land: no worker knew), and not just after a stopped worker resumed (what it had in hand)."""
    storms = [f for f in history["faults"] if f["kind"] == "model-429"]
    stats = (history.get("model") or {}).get("stats") or {}
    arrivals = sorted(stats.get("arrivals", []))
    if not storms or not arrivals:
        return 0
    admitted = {a[0] for a in stats.get("admitted", [])}
    refused = [t for t in arrivals if t not in admitted]
    resumed = [k["until"] for k in history["kills"] if k.get("signal") == "SIGSTOP" and k.get("until")]
    bad: set[float] = set()
    for r in refused:
        retry_after = _retry_after_at(storms, r)
        if retry_after is None:
            continue
        known = _cooldown_known_at(history.get("cooldowns", []), refused_at=r, retry_after=retry_after)
        bad.update(t for t in arrivals if known + GRACE_S < t < r + retry_after - TOLERANCE_S
                   and not any(0 <= t - u <= GRACE_S for u in resumed))  # fmt: skip
    return len(bad)


def _cooldown_known_at(cooldowns: Iterable[list[float]], *, refused_at: float, retry_after: float) -> float:
    """When the pool's cooldown covering a 429 answered at `refused_at` was first seen committed
    (its end at least the Retry-After after the answer, less the whole-second rounding); the answer
    itself when the history has no such observation (histories without cooldowns)."""
    seen = [t for t, until in cooldowns if t >= refused_at - 1.0 and until >= refused_at + retry_after - 1.0]
    return min(seen, default=refused_at)


def _most_in_window(admitted: list[list[float]], *, count: bool, window_s: float = 60.0) -> int:
    """Most requests (or tokens) the model admitted in any `window_s`."""
    most, total, start = 0, 0, 0
    events = sorted(admitted)
    for end in range(len(events)):
        total += 1 if count else int(events[end][1])
        while events[end][0] - events[start][0] >= window_s:
            total -= 1 if count else int(events[start][1])
            start += 1
        most = max(most, total)
    return most


def _regressions(observations: Iterable[list[Any]], jobs: Iterable[Mapping[str, Any]]) -> int:
    ids = {j["id"] for j in jobs}
    last: dict[int, tuple[str, int, int]] = {}
    count = 0
    for _, job_id, state, attempt, fence in sorted(observations, key=lambda o: o[0]):
        if job_id not in ids:
            continue
        previous = last.get(job_id)
        if previous is not None and _went_back(previous, (state, attempt, fence)):
            count += 1
        last[job_id] = (state, attempt, fence)
    for job in jobs:
        previous = last.get(job["id"])
        if previous is not None and _went_back(previous, (job["state"], job["attempt"], job["fence"])):
            count += 1
    return count


def _went_back(before: tuple[str, int, int], after: tuple[str, int, int]) -> bool:
    # The attempt number may go down: an attempt the pool refused for congestion (429) is given
    # back, not charged. The fence never goes down.
    if after[2] < before[2]:
        return True
    if before[0] in FINAL and after[0] != before[0]:
        return True
    return before[0] == "REVIEW_REQUIRED" and after[0] not in ("REVIEW_REQUIRED", *FINAL)


def _recoveries(
        history: Mapping[str, Any], attempts: list[Mapping[str, Any]]
) -> tuple[list[float], list[float], int]:
    """Seconds from each fault that took a worker away until each job it held was free again (its
    attempt ended or another began), and until another attempt began; and how many were freed late.

    Only the first is bounded: a freed job is eligible again after its backoff and then waits its
    turn like any other (the claim takes the oldest eligible first), so its re-claim also depends
    on the backlog."""
    bound = history["bounds"].get("recovery_s", 0.0) + SLACK_S
    by_job: dict[int, list[Mapping[str, Any]]] = collections.defaultdict(list)
    for a in attempts:
        by_job[a["job_id"]].append(a)
    times: list[float] = []
    reclaims: list[float] = []
    over = 0
    for kill in history["kills"]:
        if kill["kind"] != "worker" or kill.get("pid") is None:
            continue
        marker = f"-{kill['pid']}-"
        at = kill["at"]
        for a in attempts:
            held = marker in a["worker_id"] and a["started"] <= at and (a["finished"] is None or a["finished"] > at)
            if not held:
                continue
            later = [b["started"] for b in by_job[a["job_id"]] if b["fence"] > a["fence"]]
            if later:
                reclaims.append(min(later) - at)
            # Free again: the attempt ended (the reaper expired it, or the stopped worker resumed and
            # finished it), or another attempt began first.
            progress = [t for t in (*later, a["finished"]) if t is not None]
            if not progress:
                continue  # never freed: the job is counted by `lost`
            took = min(progress) - at
            times.append(took)
            if took > bound:
                over += 1
    return times, reclaims, over
