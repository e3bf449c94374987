"""
The calibration corpus of the validation policies: answers to documents, each with its class
and the verdict a correct policy reaches. `hack/bench.py validation` and the round-trip tests
read it from here, so the benchmark's figures and the tests' claims are about the same cases.

    adversarial   `lading_demo.adversarial`: clean documents in every language and layout
                  with their correct answers and single-field corruptions, and the documents
                  that cannot be booked unreviewed even when read perfectly
    quickstart    the 200 documents of examples/quickstart.yaml (`lading_demo.generator`,
                  seed 2026) as the builtin extractor answers them, each answer checked
                  against the generator's truth: clean ones SUCCEED, the misprinted totals
                  and broken IBANs go to review (the unreadable scans have no answer)
    examples      the inline documents of examples/extractionbatch.yaml with the answers a
                  careful model gives (written out below: the builtin extractor does not
                  read those layouts)

The clean corpus is every case expected to SUCCEED: a policy's false-review rate is measured
on it, and the goal is zero.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import yaml

from lading_demo import adversarial, builtin, generator

QUICKSTART_SEED = 2026
QUICKSTART_COUNT = 200
"""What hack/make_samples.py writes to examples/quickstart.yaml."""

ADVERSARIAL_SEED = 2026
ADVERSARIAL_DOCUMENTS = 280
"""Ten documents per language x layout."""

SUCCEEDED = adversarial.SUCCEEDED
REVIEW_REQUIRED = adversarial.REVIEW_REQUIRED


@dataclasses.dataclass(frozen=True)
class Case:
    """One answer to one document, and what a correct policy concludes."""

    source: str
    """`adversarial`, `quickstart` or `examples`."""
    key: str
    """The document's key within its source (`adv-0042`, `inv-0007`, `2026/03/inv-0001`)."""
    case: str
    """The answer's class: an adversarial class, `quickstart_clean`, `quickstart_<defect>`, `examples_clean`."""
    fields: tuple[str, ...]
    """The result paths where the answer is wrong (empty for a correct answer)."""
    text: str
    result: dict[str, Any]
    expected: str
    """SUCCEEDED or REVIEW_REQUIRED."""


def adversarial_cases(*, documents: int = ADVERSARIAL_DOCUMENTS, seed: int = ADVERSARIAL_SEED) -> list[Case]:
    return [
        Case(source="adversarial", key=document.key, case=answer.case, fields=answer.fields, text=document.text,
             result=answer.result, expected=answer.expected)
        for document in adversarial.documents(documents, seed=seed)
        for answer in document.answers
    ]


def quickstart_cases() -> list[Case]:
    """The quickstart documents the builtin extractor reads, answered as it answers them."""
    cases = []
    for sample in generator.generate(QUICKSTART_COUNT, seed=QUICKSTART_SEED):
        if sample.truth is None:
            continue
        result = builtin.extract_text(sample.text).result
        if result is None or {**result, "evidence": {}} != sample.truth:
            raise AssertionError(f"the builtin extractor no longer reads quickstart {sample.key} as the truth says")
        cases.append(Case(
            source="quickstart", key=sample.key, case=f"quickstart_{sample.defect or 'clean'}", fields=(),
            text=sample.text, result=result, expected=sample.expected_state,
        ))
    return cases


def example_cases(root: pathlib.Path) -> list[Case]:
    """The inline documents of `root`/examples/extractionbatch.yaml with their correct answers."""
    path = root / "examples" / "extractionbatch.yaml"
    texts: dict[str, str] = {}
    for manifest in yaml.safe_load_all(path.read_text("utf-8")):
        if manifest and manifest.get("kind") == "ExtractionBatch":
            texts.update({item["key"]: item["text"] for item in manifest["spec"].get("documents", [])})
    missing = EXAMPLE_ANSWERS.keys() - texts.keys()
    if missing:
        raise ValueError(f"{path} no longer holds the documents {', '.join(sorted(missing))}")
    return [
        Case(source="examples", key=key, case="examples_clean", fields=(), text=texts[key], result=result,
             expected=SUCCEEDED)
        for key, result in EXAMPLE_ANSWERS.items()
    ]


def cases(*, root: pathlib.Path | None = None, documents: int = ADVERSARIAL_DOCUMENTS) -> list[Case]:
    """The whole corpus: adversarial, quickstart, and (given the repository `root`) examples."""
    out = adversarial_cases(documents=documents) + quickstart_cases()
    return out + (example_cases(root) if root is not None else [])


def _line(description: str, quantity: str, unit_price: str, amount: str, rate: str) -> dict[str, str]:
    return {"description": description, "quantity": quantity, "unit_price": unit_price, "amount": amount,
            "tax_rate": rate}


EXAMPLE_ANSWERS: dict[str, dict[str, Any]] = {
    "2026/03/inv-0001": {
        "invoice_number": "RE-2026-0311",
        "issue_date": "2026-03-11",
        "due_date": "2026-03-25",
        "currency": "EUR",
        "supplier": {"name": "Hoffmann Bürobedarf KG", "vat_id": "DE713435148", "iban": "DE89370400440532013000"},
        "buyer": {"name": "Weber Maschinenbau GmbH", "vat_id": None},
        "lines": [_line("Kopierpapier A4 (Karton)", "4", "24.90", "99.60", "19"),
                  _line("Toner HP 59A", "1", "89.00", "89.00", "19")],
        "subtotal": "188.60",
        "tax_total": "35.83",
        "total": "224.43",
        "evidence": {
            "invoice_number": "RE-2026-0311", "issue_date": "11.03.2026", "due_date": "25.03.2026",
            "currency": "€", "supplier.name": "Hoffmann Bürobedarf KG", "supplier.vat_id": "DE713435148",
            "supplier.iban": "DE89 3704 0044 0532 0130 00", "buyer.name": "Weber Maschinenbau GmbH",
            "lines[0].description": "Kopierpapier A4 (Karton)", "lines[0].quantity": "4",
            "lines[0].unit_price": "24,90", "lines[0].amount": "99,60", "lines[0].tax_rate": "19 %",
            "lines[1].description": "Toner HP 59A", "lines[1].quantity": "1", "lines[1].unit_price": "89,00",
            "lines[1].amount": "89,00", "lines[1].tax_rate": "19 %",
            "subtotal": "188,60", "tax_total": "35,83", "total": "224,43",
        },
    },
    "2026/03/inv-0002": {
        "invoice_number": "NW-88213",
        "issue_date": "2026-03-14",
        "due_date": None,
        "currency": "GBP",
        "supplier": {"name": "Northwind Traders Ltd", "vat_id": "GB123456789", "iban": None},
        "buyer": {"name": "Weber Maschinenbau GmbH", "vat_id": "DE902445216"},
        "lines": [_line("Widget bracket, steel", "50", "3.20", "160.00", "0"),
                  _line("Freight", "1", "25.00", "25.00", "0")],
        "subtotal": "185.00",
        "tax_total": "0.00",
        "total": "185.00",
        "evidence": {
            "invoice_number": "NW-88213", "issue_date": "2026-03-14", "currency": "GBP",
            "supplier.name": "Northwind Traders Ltd", "supplier.vat_id": "GB123456789",
            "buyer.name": "Weber Maschinenbau GmbH", "buyer.vat_id": "DE902445216",
            "lines[0].description": "Widget bracket, steel", "lines[0].quantity": "50",
            "lines[0].unit_price": "3.20", "lines[0].amount": "160.00", "lines[0].tax_rate": "0%",
            "lines[1].description": "Freight", "lines[1].unit_price": "25.00", "lines[1].amount": "25.00",
            "lines[1].tax_rate": "0%",
            "subtotal": "185.00", "tax_total": "0.00", "total": "185.00",
        },
    },
}
"""Correct answers to examples/extractionbatch.yaml, quoted as a careful model quotes."""
