"""
Write the committed sample set from `lading_demo.generator` (seed 2026, 200 invoices):

    examples/invoices/truth.jsonl   per document: key, expected_state, defect, truth
    examples/quickstart.yaml        TenantQuota acme, InferencePool builtin, a DeliveryEndpoint on
                                    127.0.0.1:8787 with its signing Secret (`lading run` serves the
                                    reference receiver there), and an ExtractionBatch with the 200
                                    texts inline

    python hack/make_samples.py           regenerate both
    python hack/make_samples.py --check   exit 1 if the committed files are not what it would write

The generator is deterministic, so regenerating without changing it changes nothing.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lading_demo import generator  # noqa: E402  (needs ROOT on the path when not installed)

SEED = 2026
COUNT = 200
API_VERSION = "lading.dev/v1alpha1"
TRUTH_PATH = ROOT / "examples" / "invoices" / "truth.jsonl"
QUICKSTART_PATH = ROOT / "examples" / "quickstart.yaml"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="compare with the files on disk, write nothing")
    args = parser.parse_args()

    samples = generator.generate(COUNT, seed=SEED)
    wanted = {TRUTH_PATH: truth_jsonl(samples), QUICKSTART_PATH: quickstart_yaml(samples)}
    _check_round_trip(samples, wanted[QUICKSTART_PATH])
    if args.check:
        stale = [path for path, text in wanted.items()
                 if not path.exists() or path.read_text("utf-8") != text]
        for path in stale:
            print(f"{path.relative_to(ROOT)} is out of date: run python hack/make_samples.py",
                  file=sys.stderr)
        return 1 if stale else 0
    for path, text in wanted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


def truth_jsonl(samples: list[generator.Sample]) -> str:
    rows = [
        {"key": s.key, "expected_state": s.expected_state, "defect": s.defect, "truth": s.truth}
        for s in samples
    ]
    return "".join(json.dumps(row, ensure_ascii=False, sort_keys=False) + "\n" for row in rows)


def quickstart_yaml(samples: list[generator.Sample]) -> str:
    documents: list[dict[str, Any]] = [
        {
            "apiVersion": API_VERSION,
            "kind": "TenantQuota",
            "metadata": {"name": "acme"},
            "spec": {"namespaces": ["acme"], "maxQueuedJobs": 50000, "maxInFlight": 64, "weight": 1},
        },
        {
            "apiVersion": API_VERSION,
            "kind": "InferencePool",
            "metadata": {"name": "builtin", "namespace": "lading-system"},
            "spec": {
                "provider": "builtin",
                "model": "lading-builtin-invoice-v1",
                "limits": {"requestsPerMinute": 6000, "tokensPerMinute": 2000000, "maxConcurrency": 64},
                "workers": {
                    "minReplicas": 0, "maxReplicas": 4, "concurrency": 32, "targetOldestAgeSeconds": 120,
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "erp-signing", "namespace": "acme"},
            "stringData": {"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
        },
        {
            "apiVersion": API_VERSION,
            "kind": "DeliveryEndpoint",
            "metadata": {"name": "erp", "namespace": "acme"},
            "spec": {
                "url": "http://127.0.0.1:8787/webhooks/lading",
                "secretRef": {"name": "erp-signing", "key": "secret"},
                "retryBudget": {"maxAttempts": 12, "maxAgeSeconds": 3600},
            },
        },
        {
            "apiVersion": API_VERSION,
            "kind": "ExtractionBatch",
            "metadata": {"name": "quickstart-invoices", "namespace": "acme"},
            "spec": {
                "schema": "invoice.v1",
                "inferencePoolRef": {"name": "builtin", "namespace": "lading-system"},
                "deliveryEndpointRef": {"name": "erp"},
                "priority": "normal",
                "deadlineSeconds": 3600,
                "validationPolicy": "invoice-strict-v2",
                "documents": [{"key": s.key, "text": s.text} for s in samples],
            },
        },
    ]
    header = (
        "# Quickstart: a tenant, the builtin (offline, rule-based demo) pool, 200 synthetic invoices, and\n"
        "# their delivery, signed, to a webhook on 127.0.0.1:8787 (`lading run` serves the reference receiver).\n"
        "# Written by hack/make_samples.py (seed 2026); expected outcomes: examples/invoices/truth.jsonl.\n"
    )
    return header + yaml.dump_all(
        documents, Dumper=_LiteralDumper, sort_keys=False, allow_unicode=True, width=120,
        explicit_start=True,
    )


class _LiteralDumper(yaml.SafeDumper):
    """safe_dump, with multi-line strings in literal block style (`text: |`) so the texts stay readable."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_LiteralDumper.add_representer(str, _represent_str)


def _check_round_trip(samples: list[generator.Sample], text: str) -> None:
    """YAML falls back to quoting when it must; whatever the style, every text must read back exactly."""
    batch = list(yaml.safe_load_all(text))[-1]
    read = {document["key"]: document["text"] for document in batch["spec"]["documents"]}
    if any(read[s.key] != s.text for s in samples):
        raise SystemExit("a text did not survive the YAML round trip")


if __name__ == "__main__":
    sys.exit(main())
