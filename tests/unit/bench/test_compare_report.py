"""The report of `hack/bench.py compare`: ratios, targets, skipped peers, CPU from /proc (no peer runs here)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import types
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def compare() -> Iterator[types.ModuleType]:
    spec = importlib.util.spec_from_file_location("bench_compare", ROOT / "hack" / "bench_compare.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


LOAD = {"cpus": 2, "min_1m": 1.0, "median_1m": 1.5, "max_1m": 2.0}


def test_ratios_against_the_references_and_the_targets(compare: types.ModuleType) -> None:
    systems = {
        compare.LADING_SUCCEEDED: compare.Measured("Lading", jobs=20_000, seconds=5.0, worker_cpu_s=4.0),
        compare.LADING_REVIEW: compare.Measured("Lading review", jobs=20_000, seconds=4.0),
        compare.CELERY_REFERENCE: compare.Measured("Celery p4", jobs=19_999, seconds=10.0),
        compare.PROCRASTINATE_REFERENCE: compare.Measured("Procrastinate c10", jobs=3_000, seconds=10.0),
        compare.CEILING: compare.Measured("ceiling", jobs=100_000, seconds=2.0),
        compare.LADING_PROCESSES: compare.Measured("Lading --processes 2", jobs=20_000, seconds=2.5),
    }
    results, targets, passed = compare.summarize(
        [systems], skipped={}, acceptance={"ratio": 0.9, "documents": 10_000, "repetitions": 5,
                                          "accept_jobs_per_s_median": 45_000.0, "copy_jobs_per_s_median": 50_000.0},
        load=LOAD,
    )  # fmt: skip
    assert results["jobs_per_s"][compare.LADING_SUCCEEDED] == 4_000.0
    assert results["ratios"] == {
        "lading_vs_celery_prefetch_4": 2.0,  # 4,000 / 1,999.9
        "lading_vs_procrastinate_concurrency_10": 13.33,  # 4,000 / 300
        "lading_vs_asyncpg_ceiling": 0.08,
        "lading_review_vs_celery_prefetch_4": 2.5,
        "lading_processes_2_vs_celery_prefetch_4": 4.0,  # 8,000 / 1,999.9
        "lading_processes_2_vs_procrastinate_concurrency_10": 26.67,
        "lading_processes_2_vs_in_process": 2.0,
        "accept_vs_copy": 0.9,
    }
    assert passed and all(results["targets_met"].values())
    assert targets["lading_processes_2_vs_celery_prefetch_4_min"] == 2.0
    assert results["systems"][compare.LADING_SUCCEEDED]["worker_cpu_ms_per_job"] == 0.2
    assert results["systems"][compare.LADING_SUCCEEDED]["postgres_cpu_ms_per_job"] is None
    assert results["systems"][compare.LADING_SUCCEEDED]["cpu_ms_per_job_total"] is None  # PostgreSQL's unknown


def test_cpu_per_job_adds_the_worker_and_its_store(compare: types.ModuleType) -> None:
    lading = compare.Measured("Lading", jobs=1_000, seconds=1.0, worker_cpu_s=0.3, postgres_cpu_s=0.2)
    celery = compare.Measured("Celery", jobs=1_000, seconds=1.0, worker_cpu_s=0.4, broker_cpu_s=0.1)
    assert lading.to_json()["cpu_ms_per_job_total"] == 0.5
    assert celery.to_json()["cpu_ms_per_job_total"] == 0.5
    assert celery.to_json()["postgres_cpu_ms_per_job"] is None


def test_a_ratio_below_its_target_fails_the_scenario(compare: types.ModuleType) -> None:
    systems = {
        compare.LADING_SUCCEEDED: compare.Measured("Lading", jobs=4_000, seconds=1.0),
        compare.LADING_PROCESSES: compare.Measured("Lading --processes 2", jobs=2_500, seconds=1.0),
        compare.CELERY_REFERENCE: compare.Measured("Celery p4", jobs=1_500, seconds=1.0),
        compare.PROCRASTINATE_REFERENCE: compare.Measured("Procrastinate c10", jobs=100, seconds=1.0),
    }
    results, _, passed = compare.summarize([systems], skipped={}, acceptance=None, load=LOAD)
    assert not passed
    # Judged on `lading worker --processes 2`: the in-process worker's 2.67x does not count.
    assert results["targets_met"] == {
        "lading_processes_2_vs_celery_prefetch_4_min": False,  # 2,500 / 1,500
        "lading_processes_2_vs_procrastinate_concurrency_10_min": True,
        "accept_vs_copy_min": False,  # not measured: not met
    }


def test_without_the_worker_processes_run_the_throughput_targets_are_not_met(compare: types.ModuleType) -> None:
    systems = {
        compare.LADING_SUCCEEDED: compare.Measured("Lading", jobs=40_000, seconds=1.0),
        compare.CELERY_REFERENCE: compare.Measured("Celery p4", jobs=1_500, seconds=1.0),
        compare.PROCRASTINATE_REFERENCE: compare.Measured("Procrastinate c10", jobs=100, seconds=1.0),
    }
    results, _, _ = compare.summarize([systems], skipped={}, acceptance=None, load=LOAD)
    assert not results["targets_met"]["lading_processes_2_vs_celery_prefetch_4_min"]
    assert not results["targets_met"]["lading_processes_2_vs_procrastinate_concurrency_10_min"]


def test_a_skipped_peer_leaves_its_ratio_empty_and_is_named(compare: types.ModuleType) -> None:
    systems = {compare.LADING_SUCCEEDED: compare.Measured("Lading", jobs=2_000, seconds=1.0)}
    skipped = {"Celery": "not installed (celery); pip install -e '.[bench]'"}
    results, _, passed = compare.summarize([systems], skipped=skipped, acceptance=None, load=LOAD)
    assert results["ratios"]["lading_vs_celery_prefetch_4"] is None
    assert not passed and results["skipped"] == skipped
    table = compare.render_table(results)
    assert "| Celery | skipped: not installed (celery)" in table
    assert "vs Celery prefetch 4: -x" in table
    assert "| Lading | 2,000 | 2,000 |" in table


def test_cpu_ticks_read_after_the_command_name_even_with_spaces_and_parentheses(compare: types.ModuleType) -> None:
    fields = ["S", "1", "2", "3", "0", "-1", "4194560", "10", "0", "0", "0", "250", "50", "7", "3", "20"]
    stat = "4242 (postgres: x (y) z) " + " ".join(fields)
    assert compare.cpu_ticks(stat) == (300, 10)


def test_rounds_report_the_median_run_and_each_rounds_ratios(compare: types.ModuleType) -> None:
    def round_of(lading_s: float, celery_s: float) -> dict[str, object]:
        return {
            compare.LADING_SUCCEEDED: compare.Measured("Lading", jobs=1_000, seconds=lading_s, worker_cpu_s=lading_s),
            compare.LADING_PROCESSES: compare.Measured("Lading --processes 2", jobs=1_000, seconds=lading_s / 2),
            compare.CELERY_REFERENCE: compare.Measured("Celery p4", jobs=1_000, seconds=celery_s),
        }

    rounds = [round_of(1.0, 1.0), round_of(0.5, 2.0), round_of(0.25, 1.0)]
    results, _, _ = compare.summarize(rounds, skipped={}, acceptance=None, load=LOAD)
    lading = results["systems"][compare.LADING_SUCCEEDED]
    assert lading["jobs_per_s"] == 2_000.0 and lading["jobs_per_s_rounds"] == [1_000.0, 2_000.0, 4_000.0]
    assert lading["worker_cpu_ms_per_job"] == 0.5  # the median run's own CPU
    assert results["systems"][compare.CELERY_REFERENCE]["jobs_per_s"] == 1_000.0
    assert results["ratios"]["lading_vs_celery_prefetch_4"] == 2.0
    assert [r["lading_vs_celery_prefetch_4"] for r in results["ratios_per_round"]] == [1.0, 4.0, 4.0]
    table = compare.render_table(results)
    assert "| Lading | 1,000 | 2,000 (1,000 / 2,000 / 4,000) |" in table
    assert ("Each round, --processes 2 (vs Celery prefetch 4 / vs Procrastinate concurrency 10): "
            "2.00x / -x, 8.00x / -x, 8.00x / -x") in table
