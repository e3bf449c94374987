"""
The document index's faster forms find what the plain ones find: prefix-tree alternations, the
label tables, the run-mapped normalised and compacted copies, and dates read line by line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from lading.validation import cues, dates, layout

TEXTS = [
    "",
    "   \n\t",
    "  Rechnung an:\r\n  Anadolu Lojistik A.Ş.   USt-IdNr.: DE 811.907-980\r\n\r\n"
    "IBAN: TR33 0006 1005 1978 6457 8413 26",
    "Invoice #INV_2025-0042\nDate: 04.03.2025   Due date: 3 March 2025\n\n\nTotal   1.469,06 EUR  (19 %)\n   ",
    "ßtraße İstanbul ǅ ﬁle\u00a0x\u2003y\u200bz 1st March 2025 4-mar-2025 mart 4, 2025 2025/03/04",
]


def _plain(words: Sequence[str]) -> str:
    ordered = sorted(set(words), key=len, reverse=True)
    return "|".join(r"[ \t]+".join(re.escape(part) for part in word.split()) for word in ordered)


@pytest.mark.parametrize("words", [
    list(layout._CUE_ROLE), list(cues.TITLE_CUES), list(cues.DEBIT_CUES), list(cues.INVOICE_NUMBER_CUES),
    ["mar", "marzo", "mart", "march", "mars", "bill", "bill to", "a.b", "a"],
])
def test_a_prefix_tree_alternation_finds_what_the_longest_first_alternation_finds(words: list[str]) -> None:
    plain = re.compile(rf"(?:{_plain(words)})(?![\w.])")
    tree = re.compile(rf"(?:{layout.alternation(words)})(?![\w.])")
    for text in [*TEXTS, " ".join(words), "  ".join(w.upper() for w in words).lower(), "bill\t to  bill tox marzo."]:
        lowered = layout.lowered(text)
        assert [m.span() for m in tree.finditer(lowered)] == [m.span() for m in plain.finditer(lowered)]


def _classify_label(label: str, tables: dict[str, Sequence[str]]) -> str | None:
    best: tuple[int, str] | None = None
    for name, words in tables.items():
        for word in words:
            if (label == word or (label.startswith(word) and not label[len(word)].isalnum())) and (
                    best is None or len(word) > best[0]):
                best = (len(word), name)
    return best[1] if best is not None else None


def _classify_by_occurrence(label: str, tables: dict[str, Sequence[str]]) -> str | None:
    best: tuple[int, int, str] | None = None
    for name, words in tables.items():
        for word in words:
            position = label.find(word)
            if position != -1 and (best is None or (position, -len(word)) < (best[0], best[1])):
                best = (position, -len(word), name)
    return best[2] if best is not None else None


TABLES = {"issue": cues.ISSUE_DATE_CUES, "due": cues.DUE_DATE_CUES, "other": cues.OTHER_DATE_CUES,
          "number": cues.INVOICE_NUMBER_CUES + cues.OTHER_NUMBER_CUES}


def test_indexed_label_tables_classify_every_label_as_a_scan_of_the_tables_does() -> None:
    labels = [word + tail for words in TABLES.values() for word in words for tail in ("", ":", " x", "x", " (")]
    labels += ["", "nº de pedido", "rechnung nr.", "invoice date / due date", "fecha vencimiento factura"]
    for label in labels:
        assert layout.classify_label(label, TABLES) == _classify_label(label, TABLES), label
        assert layout.classify_by_occurrence(label, TABLES) == _classify_by_occurrence(label, TABLES), label


@pytest.mark.parametrize("text", TEXTS)
def test_the_copies_map_back_to_the_source_as_a_character_by_character_map_would(text: str) -> None:
    doc = layout.Document(text)
    tokens = list(re.finditer(r"\S+", text))
    assert doc.normal == " ".join(t.group() for t in tokens)
    position = 0
    for token in tokens:
        for inside in range(len(token.group()) + 1):
            assert doc.original(position + inside) == token.start() + inside
        position += len(token.group()) + 1
    runs = list(re.finditer(r"[^\W_]+", text))
    assert doc.compact == layout._upper("".join(r.group() for r in runs))
    for run in runs:
        assert run.start() in doc.find_compact(run.group())  # a whole run is a whole token
    assert doc.line_starts == [0] + [m.end() for m in re.finditer("\n", text)]


def test_dates_read_line_by_line_are_the_dates_of_the_whole_text() -> None:
    for text in TEXTS:
        lowered = layout.lowered(text)
        doc = layout.Document(text)
        by_line = [d for index in range(len(doc.line_starts))
                   for d in dates.find(lowered, start=doc.line_span(index)[0], end=doc.line_span(index)[1])]
        assert by_line == dates.find(lowered)
