"""
The fault suite: every scenario of docs/reliability.md against real processes, with a history
recorded while it runs and a checker that derives the figures from the history alone.

    python hack/reliability.py                       # the full run (make reliability), ≤ 30 min
    python hack/reliability.py --profile short       # one mixed scenario, ≤ 2 min (inside make test)
    python hack/reliability.py --profile soak        # 20,000 jobs with and without faults
    python hack/reliability.py --scenario worker-kill --seed 7     # one scenario again

It prints the table (markdown) and `N passed, N failed`, writes each scenario's history and
figures as JSON under `--output` (default .lading/reliability/), and exits 1 if any must-be-zero
figure is not zero. `--write-docs` replaces the table in docs/reliability.md with this run's.

Needs: PostgreSQL server binaries (Debian postgresql-15: the suite runs its own server, as the
`postgres` user when run as root), a RabbitMQ broker ($AMQP_URL, else 127.0.0.1:5672
guest/guest), optionally libfaketime (Debian faketime) for the clock step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import shlex
import shutil
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from hack.reliability import checker, cluster, report, scenarios  # noqa: E402

DOCS = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- reliability:table -->", "<!-- /reliability:table -->"
DEFAULT_SEED = 20260


def _documents(count: int, *, seed: int) -> list[tuple[str, str]]:
    from lading_demo import generator

    found: list[tuple[str, str]] = []
    offset = 0
    while len(found) < count:
        batch = generator.generate(max(64, (count - len(found)) * 5 // 4), seed=seed + offset)
        found += [(f"doc-{seed}-{offset}-{s.key}", s.text) for s in batch if s.expected_state == "SUCCEEDED"]
        offset += 1
    return found[:count]


async def _amqp_url() -> str:
    from tests.support import broker

    url = os.environ.get("AMQP_URL") or broker.LOCAL_URL
    if not await broker.reachable(url):
        raise SystemExit(
            f"reliability: RabbitMQ is not reachable at {broker._redacted(url)}; start it or set $AMQP_URL"
        )
    return url


async def main_async(args: argparse.Namespace) -> int:
    names = args.scenario or list(scenarios.PROFILES[args.profile])
    unknown = [n for n in names if n not in scenarios.SCENARIOS]
    if unknown:
        raise SystemExit(f"reliability: unknown scenario(s) {', '.join(unknown)}; "
                         f"known: {', '.join(scenarios.SCENARIOS)}")  # fmt: skip
    output, base = _directories(args)
    rows = []
    started = time.monotonic()
    try:
        async with cluster.running(base=base, seed=args.seed, timing=scenarios.timing_for(names),
                                   amqp_url=await _amqp_url()) as c:  # fmt: skip
            from hack.reliability import history

            await history.bind_side_queue(amqp_url=c.amqp_url, prefix=c.prefix)
            for number, name in enumerate(names):
                scenario = scenarios.SCENARIOS[name]
                count = args.documents or scenario.documents
                command = f"make reliability ARGS='--scenario {name} --seed {args.seed}'"
                print(f"[{time.monotonic() - started:6.1f} s] {name}: {count} documents", file=sys.stderr, flush=True)
                recorded = await scenarios.run(scenario, c=c, seed=args.seed, command=command,
                                               documents=_documents(count, seed=args.seed * 100 + number))  # fmt: skip
                figures = checker.check(recorded)
                row = {"scenario": name, "seed": args.seed, "covers": scenario.covers, "fault": scenario.fault,
                       "command": command, "figures": figures, "notes": recorded["notes"]}  # fmt: skip
                rows.append(row)
                (output / f"{name}.history.json").write_text(json.dumps(recorded))
                (output / f"{name}.figures.json").write_text(json.dumps(row, indent=2))
                bad = checker.violations(figures)
                print(f"[{time.monotonic() - started:6.1f} s] {name}: {'FAIL ' + str(bad) if bad else 'ok'}"
                      f"{' notes: ' + '; '.join(recorded['notes']) if recorded['notes'] else ''}",
                      file=sys.stderr, flush=True)  # fmt: skip
    finally:
        if args.keep:
            print(f"reliability: logs and data kept under {base}", file=sys.stderr)
        else:
            logs = output / "logs"
            shutil.rmtree(logs, ignore_errors=True)
            if (base / "logs").exists():
                shutil.copytree(base / "logs", logs)
            shutil.rmtree(base, ignore_errors=True)
    (output / "figures.json").write_text(json.dumps(rows, indent=2))
    print(report.table(rows))
    print(report.summary(rows))
    if args.write_docs:
        _write_docs(rows, args)
    return 1 if any(checker.violations(r["figures"]) for r in rows) else 0


def _directories(args: argparse.Namespace) -> tuple[pathlib.Path, pathlib.Path]:
    """The output folder, and a fresh temporary base for the server's data and the logs."""
    output = pathlib.Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    base = pathlib.Path(tempfile.mkdtemp(prefix="lading-reliability-"))
    os.chmod(base, 0o755)  # the server runs as `postgres` beneath it
    return output, base


def _write_docs(rows: list[dict[str, object]], args: argparse.Namespace) -> None:
    text = DOCS.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"reliability: {DOCS} has no {BEGIN} ... {END} markers to replace")
    before, rest = text.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    argv = " ".join(shlex.quote(a) for a in sys.argv[1:] if a != "--write-docs")
    table = (f"{BEGIN}\nLast run: `python hack/reliability.py {argv}` "
             f"({time.strftime('%Y-%m-%d', time.gmtime())}, seed {args.seed}).\n\n"
             f"{report.table(rows)}\n\n{report.summary(rows)}\n{END}")  # fmt: skip
    DOCS.write_text(before + table + after)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Lading's fault suite (docs/reliability.md).")
    parser.add_argument("--profile", choices=sorted(scenarios.PROFILES), default="full")
    parser.add_argument("--scenario", action="append", default=[], help="run only this scenario (repeatable)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--documents", type=int, default=0, help="documents per scenario (default: its own)")
    parser.add_argument("--output", default=str(ROOT / ".lading" / "reliability"))
    parser.add_argument("--keep", action="store_true", help="keep the server's data and every log")
    parser.add_argument("--write-docs", action="store_true", help="put this run's table into docs/reliability.md")
    args = parser.parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
