"""
The fault suite's checker finds each violation it claims to count, in a history written by hand,
and counts an ambiguous delivery (UNKNOWN_EXTERNAL, Jepsen's :info) as neither lost nor duplicated.
"""

from __future__ import annotations

import copy
from typing import Any

from hack.reliability import checker, report

T0 = 1_000_000.0


def _history() -> dict[str, Any]:
    """Two documents, both extracted once, delivered once and booked once: nothing wrong."""
    jobs = [
        {"id": i, "batch": "b", "key": f"k{i}", "state": "SUCCEEDED", "attempt": 1, "max_attempts": 3, "fence": 1,
         "deadline": T0 + 3600, "created": T0, "finished": T0 + 2, "error": None}
        for i in (1, 2)
    ]  # fmt: skip
    return {
        "scenario": "s", "seed": 1, "started": T0, "ended": T0 + 10,
        "submitted": {"b": ["k1", "k2"]}, "deleted_batches": [], "faults": [], "kills": [],
        "observations": [[T0 + 1, 1, "RUNNING", 1, 1], [T0 + 2, 1, "SUCCEEDED", 1, 1]],
        "events_seen": ["e1"], "bounds": {"recovery_s": 3.7}, "notes": [],
        "model": {"limits": {"rpm": 600, "tpm": 10**6, "concurrency": 4},
                  "stats": {"admitted": [[T0 + 1, 10], [T0 + 1.5, 10]], "arrivals": [T0 + 1, T0 + 1.5],
                            "max_concurrent": 2, "refusals": {}}},
        "final": {
            "jobs": jobs,
            "attempts": [{"job_id": i, "fence": 1, "attempt": 1, "worker_id": "h-100-ab", "started": T0 + 1,
                          "finished": T0 + 2, "outcome": "ok", "error_class": None} for i in (1, 2)],
            "results": [{"job_id": 1, "fence": 1}, {"job_id": 2, "fence": 1}],
            "stale": [],
            "outbox": [{"event_id": "e1", "type": "extraction.completed.v1", "created": T0 + 2, "published": T0 + 3}],
            "inbox": [],
            "deliveries": [{"delivery_id": f"d{i}", "job_id": i, "state": "DELIVERED", "attempt": 1,
                            "ambiguous_attempts": 0} for i in (1, 2)],
            "delivery_attempts": [{"delivery_id": f"d{i}", "fence": 1, "attempt": 1, "outcome": "ok",
                                   "http_status": 200, "started": T0 + 3} for i in (1, 2)],
            "erp_inbox": [{"delivery_id": f"d{i}", "status": "accepted", "reference": f"L{i}"} for i in (1, 2)],
            "ledger": [{"delivery_id": f"d{i}", "lading_job_id": str(i), "reference": f"L{i}"} for i in (1, 2)],
        },
    }  # fmt: skip


def test_a_clean_history_has_no_violation() -> None:
    assert checker.violations(checker.check(_history())) == {}


def test_each_violation_is_found() -> None:
    h = copy.deepcopy(_history())
    final = h["final"]
    h["submitted"]["b"].append("k3")  # asked for, never became a job
    final["jobs"].append({**final["jobs"][0], "id": 9, "key": "k1"})  # a second job for k1 ...
    final["jobs"][-1]["state"] = "RETRY_SCHEDULED"  # ... that is also not settled
    final["ledger"].append({"delivery_id": "d1", "lading_job_id": "1", "reference": "L9"})  # booked twice
    final["results"][1]["fence"] = 0  # a superseded attempt's result stands
    final["attempts"][1]["started"] = final["jobs"][1]["deadline"] + 5  # begun after the deadline
    h["observations"].append([T0 + 3, 1, "RUNNING", 2, 2])  # SUCCEEDED left
    final["outbox"].append({"event_id": "e2", "type": "x", "created": T0 + 4, "published": None})
    final["outbox"].append({"event_id": "e3", "type": "x", "created": T0 + 4, "published": T0 + 5})
    h["model"]["stats"]["max_concurrent"] = 5  # one over the pool's cap
    figures = checker.check(h)
    assert checker.violations(figures) == {
        "lost": 2, "duplicate_jobs": 1, "duplicate_effects": 1, "stale_overwrites_applied": 1,
        "attempts_after_deadline": 1, "status_regressions": 2, "events_unpublished": 1,
        "events_never_delivered": 1, "limiter_overshoot_concurrency": 1,
    }  # fmt: skip


def test_a_request_inside_a_retry_after_window_is_a_violation_and_one_on_the_wire_is_not() -> None:
    h = _history()
    h["faults"] = [{"kind": "model-429", "target": "model", "start": T0, "end": T0 + 1, "retry_after": 5}]
    refused = T0 + 1.0
    on_the_wire = refused + 0.5  # granted before the cooldown was known
    too_early = refused + 3.0
    h["model"]["stats"]["arrivals"] = [refused, on_the_wire, too_early, refused + 6.0]
    h["model"]["stats"]["admitted"] = [[on_the_wire, 10], [too_early, 10], [refused + 6.0, 10]]
    assert checker.check(h)["retry_after_violations"] == 1


def test_an_ambiguous_delivery_is_info_not_lost_nor_duplicated() -> None:
    h = _history()
    h["final"]["deliveries"][0]["state"] = "UNKNOWN_EXTERNAL"
    h["final"]["erp_inbox"] = h["final"]["erp_inbox"][1:]
    figures = checker.check(h)
    assert checker.violations(figures) == {}
    assert figures["info"] == 1


def _killed_and_reclaimed(*, reaped_after_s: float, reclaimed_after_s: float) -> dict[str, Any]:
    h = _history()
    kill_at = T0 + 1.5
    h["kills"] = [{"kind": "worker", "name": "worker-0", "pid": 100, "signal": "SIGKILL", "at": kill_at}]
    attempts = h["final"]["attempts"]
    attempts[0].update(finished=kill_at + reaped_after_s, outcome="lease-expired")
    attempts.append({**attempts[0], "fence": 2, "attempt": 2, "worker_id": "h-200-cd",
                     "started": kill_at + reclaimed_after_s, "finished": kill_at + reclaimed_after_s + 1,
                     "outcome": "ok"})  # fmt: skip
    h["final"]["jobs"][0]["fence"] = 2
    h["final"]["results"][0]["fence"] = 2
    return h


def test_a_job_held_by_a_killed_worker_and_freed_late_is_over_the_bound() -> None:
    figures = checker.check(_killed_and_reclaimed(reaped_after_s=9.0, reclaimed_after_s=9.5))
    assert figures["recovery_over_bound"] == 1 and figures["recovery_max_s"] == 9.0


def test_a_job_freed_in_time_and_claimed_after_the_backlog_is_within_the_bound() -> None:
    figures = checker.check(_killed_and_reclaimed(reaped_after_s=3.5, reclaimed_after_s=9.0))
    assert figures["recovery_over_bound"] == 0
    assert (figures["recovery_max_s"], figures["reclaim_max_s"]) == (3.5, 9.0)


def test_an_attempt_given_back_after_a_429_is_not_a_regression_but_a_lower_fence_is() -> None:
    h = _history()
    h["observations"] = [[T0 + 1, 1, "RUNNING", 1, 1], [T0 + 1.2, 1, "RETRY_SCHEDULED", 0, 1],
                         [T0 + 2, 1, "SUCCEEDED", 1, 1]]  # fmt: skip
    assert checker.check(h)["status_regressions"] == 0
    h["observations"].insert(1, [T0 + 1.1, 1, "RUNNING", 1, 2])
    assert checker.check(h)["status_regressions"] >= 1


def test_the_table_has_a_column_for_every_figure_that_must_be_zero() -> None:
    rows = [{"scenario": "s", "seed": 1, "figures": checker.check(_history())}]
    head = report.table(rows).splitlines()[0]
    assert all(f" {report.SHORT_NAMES[name]} |" in head for name in checker.MUST_BE_ZERO)


def test_a_deadline_job_must_end_failed_for_its_deadline() -> None:
    h = _history()
    h["expect"] = {"deadline_batches": ["b"]}
    for job in h["final"]["jobs"]:
        job.update(state="FAILED_TERMINAL", error="DEADLINE_EXHAUSTED")
    h["final"]["deliveries"] = []
    assert checker.check(h)["outcome_violations"] == 0
    h["final"]["jobs"][1]["error"] = "RATE_LIMITED"  # failed, but not for its deadline
    assert checker.check(h)["outcome_violations"] == 1


def test_a_deleted_batch_must_be_cancelled_once_with_nothing_sent_for_a_cancelled_job() -> None:
    h = _history()
    h["expect"] = {"cancelled_batches": ["b"], "failpoint_kills": 1}
    h["kills"] = [{"kind": "operator", "name": "operator", "pid": 7, "signal": "failpoint x", "at": T0 + 1.5}]
    job_2 = h["final"]["jobs"][1]
    job_2.update(state="CANCELLED", finished=T0 + 3)  # job 1 SUCCEEDED before the cancellation at T0 + 3
    h["final"]["results"] = h["final"]["results"][:1]
    h["final"]["deliveries"] = h["final"]["deliveries"][:1]
    h["kube_events"] = [{"reason": "Cancelled", "object": "b", "type": "Normal", "message": "1 cancelled"}]
    assert checker.check(h)["outcome_violations"] == 0

    late = copy.deepcopy(h)
    late["final"]["jobs"][0]["finished"] = T0 + 9  # succeeded after its batch was cancelled
    sent = copy.deepcopy(h)
    sent["final"]["deliveries"].append({**sent["final"]["deliveries"][0], "delivery_id": "d2", "job_id": 2})
    twice = copy.deepcopy(h)
    twice["kube_events"] *= 2  # the cancellation reported twice
    left = copy.deepcopy(h)
    left["faults"].append({"kind": "deletion-not-converged", "target": "b", "start": T0, "end": None})
    missed = copy.deepcopy(h)
    missed["kills"] = []  # the failpoint never fired
    for broken in (late, sent, twice, left, missed):
        assert checker.check(broken)["outcome_violations"] == 1


def test_a_request_granted_before_the_cooldown_was_committed_or_held_by_a_stopped_worker_is_not_a_violation() -> None:
    h = _history()
    h["faults"] = [{"kind": "model-429", "target": "model", "start": T0, "end": T0 + 1, "retry_after": 5}]
    refused = T0 + 1.0
    committed = refused + 2.0  # a loaded worker committed the pool's cooldown 2 s after the answer
    h["cooldowns"] = [[committed, refused + 5.0]]
    before_commit = committed + 1.0  # granted while no worker knew: GRACE_S after the commit
    after_commit = committed + 2.0  # granted after the commit: a violation
    resumed = refused + 4.6
    h["kills"] = [{"kind": "worker", "name": "worker-0", "pid": 1, "signal": "SIGSTOP", "at": T0 - 20,
                   "until": resumed - 0.1}]  # fmt: skip
    h["model"]["stats"]["arrivals"] = [refused, before_commit, after_commit, resumed]
    h["model"]["stats"]["admitted"] = [[t, 10] for t in (before_commit, after_commit, resumed)]
    assert checker.check(h)["retry_after_violations"] == 1
    h["cooldowns"] = []  # never committed: bounded from the answer itself
    assert checker.check(h)["retry_after_violations"] == 2
