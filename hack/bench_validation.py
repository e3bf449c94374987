"""
The `validation` benchmark (run through hack/bench.py, or alone: `python hack/bench_validation.py`):
how each validation policy judges the calibration corpus (`lading_demo.corpus`), and what
judging costs per document.

    confusion   per answer class and policy: how many answers, the verdict a correct policy
                reaches, how many ended SUCCEEDED and REVIEW_REQUIRED, how many were judged
                wrongly, and the first few wrongly judged documents (key and source, to
                reproduce with `lading_demo.corpus`)
    clean       the false-review rate on the clean corpus (every answer expected to SUCCEED)
    wrong       the share of wrong answers that would have been delivered (SUCCEEDED)
    cost        validation time per document in µs (median, p95, mean) over the whole corpus,
                measured on a second pass so imports and caches are warm; it runs on the
                worker's hot path, once per extracted document

Targets, for `invoice-strict-v2`: every wrong answer in review and no clean answer held. The
benchmark fails, saying so, when `invoice-strict-v2` is not a registered policy. The readable
matrices go to stderr, the JSON report to stdout.
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lading import validation  # noqa: E402
from lading_demo import adversarial, corpus  # noqa: E402

POLICIES = ("invoice-strict-v1", "invoice-strict-v2")
TARGET_POLICY = "invoice-strict-v2"
MISSES_SHOWN = 5
"""Wrongly judged documents listed per class and policy."""


def run(*, documents: int = corpus.ADVERSARIAL_DOCUMENTS) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """(results, targets, passed) as hack/bench.py scenarios report them; matrices on stderr."""
    cases = corpus.cases(root=ROOT, documents=documents)
    known = validation.known_policies()
    results: dict[str, Any] = {
        "corpus": {
            "answers": len(cases),
            "documents": len({(case.source, case.key) for case in cases}),
            "clean_answers": sum(case.expected == corpus.SUCCEEDED for case in cases),
            "wrong_answers": sum(case.expected == corpus.REVIEW_REQUIRED for case in cases),
            "adversarial_seed": corpus.ADVERSARIAL_SEED,
            "adversarial_documents": documents,
        },
        "policies": {},
    }
    for policy in POLICIES:
        if policy not in known:
            results["policies"][policy] = {
                "error": f"{policy} is not a registered policy (known: {', '.join(sorted(known))})",
            }
            print(f"\n{policy}: NOT REGISTERED (known: {', '.join(sorted(known))})", file=sys.stderr)
            continue
        report = judge(cases, policy=policy)
        results["policies"][policy] = report
        print(matrix(report, policy=policy), file=sys.stderr)
    targets = {"policy": TARGET_POLICY, "wrong_answers_succeeded": 0, "clean_false_review_rate": 0.0}
    target = results["policies"][TARGET_POLICY]
    if "error" in target:
        results["error"] = target["error"]
    passed = "error" not in target and target["wrong_answers_succeeded"] == 0 and target["clean_false_reviews"] == 0
    return results, targets, passed


def judge(cases: Sequence[corpus.Case], *, policy: str) -> dict[str, Any]:
    """Verdicts and per-document cost of `policy` over `cases`."""
    actual = [_state(validation.validate(case.result, source_text=case.text, policy=policy)) for case in cases]
    costs_us = []
    for case in cases:
        started = time.perf_counter_ns()
        validation.validate(case.result, source_text=case.text, policy=policy)
        costs_us.append((time.perf_counter_ns() - started) / 1000)
    by_class: dict[str, dict[str, Any]] = {}
    order = {name: index for index, name in enumerate(adversarial.CLASSES)}
    for case, state in sorted(zip(cases, actual, strict=True), key=lambda pair: order.get(pair[0].case, 99)):
        row = by_class.setdefault(case.case, {
            "expected": case.expected, "answers": 0, corpus.SUCCEEDED: 0, corpus.REVIEW_REQUIRED: 0, "wrong": 0,
            "misses": [],
        })
        row["answers"] += 1
        row[state] += 1
        if state != case.expected:
            row["wrong"] += 1
            if len(row["misses"]) < MISSES_SHOWN:
                row["misses"].append(f"{case.source}:{case.key}")
    clean = [state for case, state in zip(cases, actual, strict=True) if case.expected == corpus.SUCCEEDED]
    wrong = [state for case, state in zip(cases, actual, strict=True) if case.expected == corpus.REVIEW_REQUIRED]
    clean_false_reviews = sum(state == corpus.REVIEW_REQUIRED for state in clean)
    wrong_succeeded = sum(state == corpus.SUCCEEDED for state in wrong)
    costs_us.sort()
    return {
        "classes": by_class,
        "clean_answers": len(clean),
        "clean_false_reviews": clean_false_reviews,
        "clean_false_review_rate": round(clean_false_reviews / len(clean), 4) if clean else 0.0,
        "wrong_answers": len(wrong),
        "wrong_answers_succeeded": wrong_succeeded,
        "wrong_answers_succeeded_rate": round(wrong_succeeded / len(wrong), 4) if wrong else 0.0,
        "cost_us_per_document": {
            "median": round(statistics.median(costs_us), 1),
            "p95": round(costs_us[int(0.95 * (len(costs_us) - 1))], 1),
            "mean": round(statistics.fmean(costs_us), 1),
        },
    }


def _state(verdict: validation.Verdict) -> str:
    return corpus.SUCCEEDED if verdict.passed else corpus.REVIEW_REQUIRED


def matrix(report: dict[str, Any], *, policy: str) -> str:
    """The confusion matrix of one policy as a readable table."""
    width = max(len(name) for name in report["classes"]) + 2
    lines = [
        "",
        f"{policy}",
        f"{'class'.ljust(width)}{'expected':>16}{'answers':>9}{'SUCCEEDED':>11}{'REVIEW':>8}{'wrong':>7}",
    ]
    for name, row in report["classes"].items():
        lines.append(
            f"{name.ljust(width)}{row['expected']:>16}{row['answers']:>9}{row[corpus.SUCCEEDED]:>11}"
            f"{row[corpus.REVIEW_REQUIRED]:>8}{row['wrong']:>7}"
            + (f"   e.g. {', '.join(row['misses'][:3])}" if row["wrong"] else "")
        )
    cost = report["cost_us_per_document"]
    lines += [
        f"clean answers held: {report['clean_false_reviews']} of {report['clean_answers']}"
        f" ({report['clean_false_review_rate']:.2%})",
        f"wrong answers delivered: {report['wrong_answers_succeeded']} of {report['wrong_answers']}"
        f" ({report['wrong_answers_succeeded_rate']:.2%})",
        f"validation cost per document: median {cost['median']} µs, p95 {cost['p95']} µs, mean {cost['mean']} µs",
    ]
    return "\n".join(lines)


async def bench_validation(url: str) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """The hack/bench.py scenario; `url` (its database) is not used: validation touches no database."""
    del url
    return run()


if __name__ == "__main__":
    import json
    import os
    import platform

    found, wanted, ok = run()
    print(json.dumps({
        "scenario": "validation",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "results": found, "targets": wanted, "pass": ok,
    }, indent=2, ensure_ascii=False))
    sys.exit(0 if ok else 1)
