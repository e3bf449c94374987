"""Named SQL queries: every name is unique and every repository call names a real query."""

from __future__ import annotations

import pathlib
import re

import pytest

from lading.db import queries

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_every_query_used_in_code_exists() -> None:
    used: set[str] = set()
    for path in (ROOT / "lading").rglob("*.py"):
        used |= set(re.findall(r'queries\.sql\("([a-z0-9_]+)"\)', path.read_text()))
    assert used, "the repositories use named queries"
    assert used <= queries.names()


def test_query_names_follow_table_verb_naming() -> None:
    for name in queries.names():
        assert re.fullmatch(r"[a-z]+_[a-z0-9_]+", name), name


def test_an_unknown_query_name_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="no SQL query named 'job_frobnicate'"):
        queries.sql("job_frobnicate")


def _package(root: pathlib.Path, name: str, files: dict[str, str]) -> str:
    folder = root / name / "sql"
    folder.mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    for file, text in files.items():
        (folder / file).write_text(text)
    return name


def test_a_fragment_is_substituted_into_every_query_that_includes_it(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    package = _package(tmp_path, "frag_ok", {"t.sql": (
        "-- fragment: t_live\n-- a comment that is not part of it\nt.alive AND t.n > 0\n\n"
        "-- name: t_count\nSELECT count(*) FROM t WHERE {{t_live}};\n\n"
        "-- name: t_other\nSELECT 1 FROM t WHERE t.id = $1 AND {{t_live}}\n"
    )})
    loader = queries.Loader(package)
    assert loader.sql("t_count") == "SELECT count(*) FROM t WHERE (t.alive AND t.n > 0)"
    assert loader.sql("t_other") == "SELECT 1 FROM t WHERE t.id = $1 AND (t.alive AND t.n > 0)"
    assert loader.names() == {"t_count", "t_other"}


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"t.sql": "-- name: t_a\nSELECT {{t_nowhere}}\n"}, "unknown SQL fragment {{t_nowhere}}"),
        ({"t.sql": "-- fragment: t_idle\nTRUE\n\n-- name: t_a\nSELECT 1\n"}, "used by no query.*t_idle"),
        ({"a.sql": "-- name: t_a\nSELECT 1\n", "b.sql": "-- name: t_a\nSELECT 2\n"}, "duplicate query name 't_a'"),
    ],
)
def test_a_broken_set_of_files_is_refused_at_load(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str], message: str
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    package = _package(tmp_path, f"frag_bad_{abs(hash(message))}", files)
    with pytest.raises(RuntimeError, match=message):
        queries.Loader(package)


ELIGIBLE_READERS = (
    "job_claim_batch", "job_oldest_eligible_age_by_pool", "pool_scaling_load", "pool_status_report",
    "batch_get_observed", "tenant_queues_of_pool",
)  # fmt: skip


def test_every_reader_of_eligible_jobs_uses_the_one_definition() -> None:
    eligible = queries.fragment("job_eligible")
    for name in ELIGIBLE_READERS:
        assert eligible in queries.sql(name), name


def test_nothing_restates_what_an_eligible_job_is() -> None:
    # The definition's tell: waiting states and the suspension flag side by side. No SQL file or
    # module says it: the condition is the database function lading_job_eligible (migration 0024;
    # migrations are history), and tests/integration/test_eligible_definition.py checks the schema.
    restated = re.compile(r"state\s+IN\s+\('READY',\s*'RETRY_SCHEDULED'\)\s+AND\s+NOT\s+(\w+\.)?suspended")
    sources = [*(ROOT / "lading" / "db" / "sql").glob("*.sql")]
    for component in ("lading", "operator", "worker", "cli"):
        sources += [p for p in (ROOT / component).rglob("*.py")]
    found = []
    for path in sources:
        text = path.read_text()
        if path.name == "jobs.sql":
            text = text.replace(text[text.index("-- fragment: job_eligible"):text.index("-- name: ")], "")
        if restated.search(text):
            found.append(str(path.relative_to(ROOT)))
    assert found == []
