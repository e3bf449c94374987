"""
An invoice whose document shows no currency at all, with a correct `invoice.v1` answer:
`invoice-strict-v2` delivers it only when a default currency naming EUR grounds the answer.
Every other check passes, so a verdict on it is decided by the default currency alone.
"""

from __future__ import annotations

from typing import Any, Final

NO_CURRENCY_DOCUMENT: Final = """\
Nordlicht Software GmbH
Hauptstraße 5 · 20457 Hamburg
USt-IdNr.: DE123456789

Rechnung an:
Anadolu Lojistik A.Ş.
USt-IdNr.: DE811907980

Rechnungsnummer: RE-2025-0042
Rechnungsdatum: 04.03.2025

Beratung   2   617,25   19%   1.234,50

Zwischensumme:   1.234,50
MwSt. 19%:   234,56
Gesamtbetrag:   1.469,06

IBAN: DE89 3704 0044 0532 0130 00
"""

NO_CURRENCY_ANSWER: Final[dict[str, Any]] = {
    "invoice_number": "RE-2025-0042", "issue_date": "2025-03-04", "currency": "EUR",
    "supplier": {"name": "Nordlicht Software GmbH", "vat_id": "DE123456789", "iban": "DE89370400440532013000"},
    "buyer": {"name": "Anadolu Lojistik A.Ş.", "vat_id": "DE811907980"},
    "lines": [{"description": "Beratung", "quantity": "2", "unit_price": "617.25", "amount": "1234.50",
               "tax_rate": "19"}],
    "subtotal": "1234.50", "tax_total": "234.56", "total": "1469.06",
    "evidence": {"invoice_number": "RE-2025-0042", "supplier.iban": "DE89 3704 0044 0532 0130 00",
                 "lines[0].amount": "1.234,50", "subtotal": "Zwischensumme:   1.234,50",
                 "tax_total": "MwSt. 19%:   234,56", "total": "Gesamtbetrag:   1.469,06"},
}  # fmt: skip
