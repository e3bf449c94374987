"""
Synthetic OCR invoice texts with ground truth: the corpus for demos, tests and benchmarks.

`generate(count, seed=...)` renders invoices the way OCR hands them over, in three
structurally different layouts:

    ledger       title, stacked "Label: value" header fields and party blocks, a
                 whitespace-aligned table, "Label: amount" totals
    two-column   header fields two per line, supplier and buyer side by side, numbered
                 item records ("2 pcs x 149.90 = 299.80 (VAT 20%)"), dot-leader totals
    letterhead   the supplier's name and address on top with no label, header labels above
                 their values in columns, a boxed (or plain) table, right-aligned totals

in Turkish, English and German wording, with both thousands conventions ("1.234,56" and
"1,234.56"), descriptions continued on a second line, three date styles, and light OCR
noise (doubled spaces, O/0 swaps, stray punctuation, re-wrapped header text). Noise only
ever lands in text that no ground-truth value is read from.

Each Sample says what a correct pipeline concludes:

    clean       17 of 20  SUCCEEDED         truth: the invoice as printed
    defective    2 of 20  REVIEW_REQUIRED   truth: what is printed, although it is wrong:
                                            a total that is not subtotal + tax
                                            ("totals_mismatch"), or an IBAN whose mod-97
                                            check fails ("bad_iban_checksum")
    unreadable   1 of 20  FAILED_TERMINAL   truth: None (garbled scan, no number, no totals)

The mix is exact in every block of 20 consecutive samples, and each block depends only on
the seed, so a shorter run is a prefix of a longer one with the same seed.

This module owns the corpus, not the judgement: the validation policy decides states, and
the builtin extractor (`lading_demo.builtin`) reads the texts without seeing the truth.
"""

# ruff: noqa: RUF001  (the Turkish dotless i and the multiplication sign are meant, not confusables)

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import random
from collections.abc import Sequence
from typing import Any

from lading.models import invoice

SUCCEEDED = "SUCCEEDED"
REVIEW_REQUIRED = "REVIEW_REQUIRED"
FAILED_TERMINAL = "FAILED_TERMINAL"

TOTALS_MISMATCH = "totals_mismatch"
BAD_IBAN_CHECKSUM = "bad_iban_checksum"
UNREADABLE = "unreadable"

BLOCK_SIZE = 20
"""Samples per block; each block holds exactly BLOCK_DEFECTIVE + BLOCK_UNREADABLE bad ones."""
BLOCK_DEFECTIVE = 2
"""Defective documents per block (10%): each is a totals mismatch or a bad IBAN checksum."""
BLOCK_UNREADABLE = 1
"""Unreadable documents per block (5%)."""

LAYOUTS = ("ledger", "two-column", "letterhead")
LANGUAGES = ("tr", "en", "de")


@dataclasses.dataclass(frozen=True)
class Sample:
    """One generated document and what a correct pipeline makes of it."""

    key: str
    """Document key within a batch, e.g. `inv-0001`."""
    text: str
    """The OCR text handed to the provider."""
    truth: dict[str, Any] | None
    """The correct `invoice.v1` JSON without evidence (`evidence == {}`); None when unreadable."""
    expected_state: str
    """SUCCEEDED, REVIEW_REQUIRED or FAILED_TERMINAL."""
    defect: str | None
    """Why it is not SUCCEEDED: `totals_mismatch`, `bad_iban_checksum` or `unreadable`."""
    layout: str
    """Which layout rendered it (see LAYOUTS); for coverage checks and debugging."""
    language: str
    """`tr`, `en` or `de`."""


def generate(count: int, *, seed: int) -> list[Sample]:
    """`count` samples, keyed `inv-0001`..., the same for the same seed on every machine."""
    if count < 0:
        raise ValueError("count must not be negative")
    master = random.Random(seed)
    samples: list[Sample] = []
    while len(samples) < count:
        kinds = [UNREADABLE] * BLOCK_UNREADABLE + ["defective"] * BLOCK_DEFECTIVE
        kinds += ["clean"] * (BLOCK_SIZE - len(kinds))
        master.shuffle(kinds)
        for kind in kinds:
            sample_seed = master.getrandbits(64)
            if len(samples) < count:
                key = f"inv-{len(samples) + 1:04d}"
                samples.append(_sample(key=key, kind=kind, rng=random.Random(sample_seed)))
    return samples


# ---------------------------------------------------------------------------------------------
# the invoice behind a text
# ---------------------------------------------------------------------------------------------

_CENT = decimal.Decimal("0.01")
_HUNDRED = decimal.Decimal(100)


@dataclasses.dataclass(frozen=True)
class _Party:
    name: str
    country: str
    vat_id: str | None
    """Compact, as in the truth."""
    vat_printed: str | None
    address: tuple[str, ...]
    phone: str
    email: str
    tax_office: str | None


@dataclasses.dataclass(frozen=True)
class _Item:
    description: str
    quantity: decimal.Decimal
    unit: str
    unit_price: decimal.Decimal
    amount: decimal.Decimal
    rate: int
    tax: decimal.Decimal


@dataclasses.dataclass(frozen=True)
class _Doc:
    lang: str
    decimal_comma: bool
    grouped: bool
    number: str
    issue: dt.date
    due: dt.date | None
    date_style: str
    currency: str
    mark: str
    """How the currency is printed next to amounts: an ISO code, `TL` or a symbol."""
    mark_before: bool
    mark_on: str
    """Which totals lines carry the mark: `all`, `total` or `none` (only with a currency field)."""
    currency_field: bool
    supplier: _Party
    buyer: _Party
    iban: str | None
    """Compact, as printed (and so as in the truth, even when its checksum is wrong)."""
    iban_grouped: bool
    bic: str
    bank: str
    items: tuple[_Item, ...]
    subtotal: decimal.Decimal
    tax_total: decimal.Decimal
    total: decimal.Decimal
    """As printed: subtotal + tax_total, except in a `totals_mismatch` document."""
    order_no: str | None
    rate_style: str

    def truth(self) -> dict[str, Any]:
        return invoice.Invoice(
            invoice_number=self.number,
            issue_date=self.issue,
            due_date=self.due,
            currency=self.currency,
            supplier=invoice.Supplier(name=self.supplier.name, vat_id=self.supplier.vat_id, iban=self.iban),
            buyer=invoice.Party(name=self.buyer.name, vat_id=self.buyer.vat_id),
            lines=[
                invoice.Line(
                    description=item.description,
                    quantity=_plain(item.quantity),
                    unit_price=f"{item.unit_price:.2f}",
                    amount=f"{item.amount:.2f}",
                    tax_rate=str(item.rate),
                )
                for item in self.items
            ],
            subtotal=f"{self.subtotal:.2f}",
            tax_total=f"{self.tax_total:.2f}",
            total=f"{self.total:.2f}",
        ).to_json()


def _plain(value: decimal.Decimal) -> str:
    """`2.50` -> `2.5`, `10` -> `10`: a quantity as the truth states it."""
    return format(value.normalize(), "f")


def _round(value: decimal.Decimal) -> decimal.Decimal:
    return value.quantize(_CENT, rounding=decimal.ROUND_HALF_UP)


# ---------------------------------------------------------------------------------------------
# vocabulary
# ---------------------------------------------------------------------------------------------

_WORDS: dict[str, dict[str, tuple[str, ...]]] = {
    "en": {
        "title": ("INVOICE", "Invoice", "TAX INVOICE"),
        "number": ("Invoice No", "Invoice Number", "Invoice #"),
        "issue": ("Invoice Date", "Date", "Issue Date"),
        "due": ("Due Date", "Payment Due"),
        "currency": ("Currency",),
        "supplier": ("Supplier", "From", "Seller"),
        "buyer": ("Bill To", "Customer", "Buyer"),
        "vat": ("VAT ID", "VAT No", "VAT Reg. No"),
        "order": ("Order No", "PO Number", "Customer No"),
        "delivery": ("Delivery Date", "Order Date"),
        "subtotal": ("Subtotal", "Net Amount", "Total excl. VAT"),
        "tax": ("VAT", "Tax"),
        "tax_total": ("Total VAT", "VAT Total"),
        "total": ("Total", "Total Due", "Amount Due", "Grand Total", "Total incl. VAT"),
        "items": ("Items", "Line items"),
        "bank": ("Bank details", "Payment details"),
        "page": ("Page 1 of 1", "Page 1/1"),
        "tel": ("Tel", "Phone"),
        "notes": (
            "Thank you for your business.",
            "Payment within {days} days of the invoice date, without deduction.",
            "Please quote the invoice number with your payment.",
            "Goods remain our property until paid in full.",
            "Questions about this invoice? Contact our accounts team by e-mail.",
        ),
        "unreadable": ("scan quality too low", "page could not be processed", "illegible"),
    },
    "tr": {
        "title": ("FATURA", "e-Arşiv Fatura", "e-Fatura"),
        "number": ("Fatura No", "Fatura Numarası", "Belge No"),
        "issue": ("Fatura Tarihi", "Tarih", "Düzenleme Tarihi"),
        "due": ("Vade Tarihi", "Son Ödeme Tarihi"),
        "currency": ("Para Birimi", "Döviz Cinsi"),
        "supplier": ("Satıcı", "Düzenleyen"),
        "buyer": ("Alıcı", "Sayın", "Müşteri"),
        "vat": ("VKN", "Vergi No", "Vergi Kimlik No"),
        "order": ("Sipariş No", "İrsaliye No", "Müşteri No"),
        "delivery": ("İrsaliye Tarihi", "Sipariş Tarihi"),
        "subtotal": ("Ara Toplam", "Mal Hizmet Toplam Tutarı", "Toplam Tutar (KDV Hariç)"),
        "tax": ("KDV", "Hesaplanan KDV"),
        "tax_total": ("Toplam KDV", "KDV Toplamı"),
        "total": ("Genel Toplam", "Ödenecek Tutar", "Vergiler Dahil Toplam Tutar"),
        "items": ("Kalemler", "Mal ve Hizmetler"),
        "bank": ("Banka Bilgileri", "Ödeme Bilgileri"),
        "page": ("Sayfa 1/1", "Sayfa 1 / 1"),
        "tel": ("Tel", "Telefon"),
        "notes": (
            "Bu fatura elektronik ortamda düzenlenmiştir.",
            "Ödemenizi {days} gün içinde aşağıdaki hesaba yapmanızı rica ederiz.",
            "Faturaya 8 gün içinde itiraz edilmediği takdirde aynen kabul edilmiş sayılır.",
            "Bizi tercih ettiğiniz için teşekkür ederiz.",
        ),
        "unreadable": ("okunamadı", "tarama kalitesi yetersiz"),
    },
    "de": {
        "title": ("RECHNUNG", "Rechnung"),
        "number": ("Rechnungsnummer", "Rechnung Nr.", "Rechnungs-Nr."),
        "issue": ("Rechnungsdatum", "Datum"),
        "due": ("Fällig am", "Zahlbar bis", "Fälligkeitsdatum"),
        "currency": ("Währung",),
        "supplier": ("Lieferant", "Verkäufer", "Rechnungssteller"),
        "buyer": ("Rechnungsempfänger", "Kunde", "An"),
        "vat": ("USt-IdNr.", "USt-ID", "UID"),
        "order": ("Bestellnummer", "Kundennummer", "Lieferschein-Nr."),
        "delivery": ("Lieferdatum", "Leistungsdatum"),
        "subtotal": ("Zwischensumme", "Nettobetrag", "Summe netto"),
        "tax": ("MwSt.", "USt.", "Umsatzsteuer"),
        "tax_total": ("MwSt. gesamt", "Summe MwSt.", "Umsatzsteuer gesamt"),
        "total": ("Gesamtbetrag", "Rechnungsbetrag", "Summe brutto", "Endbetrag"),
        "items": ("Positionen", "Leistungen"),
        "bank": ("Bankverbindung", "Zahlungsinformationen"),
        "page": ("Seite 1 von 1", "Seite 1/1"),
        "tel": ("Tel.", "Telefon"),
        "notes": (
            "Vielen Dank für Ihren Auftrag.",
            "Zahlbar innerhalb von {days} Tagen ohne Abzug.",
            "Bitte geben Sie bei Zahlung die Rechnungsnummer an.",
            "Es gelten unsere Allgemeinen Geschäftsbedingungen.",
        ),
        "unreadable": ("unleserlich", "Scan fehlerhaft"),
    },
}

_MONTHS = {
    "en": ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December"),
    "tr": ("Ocak", "Şubat", "Mart", "Nisan", "Mayıs", "Haziran", "Temmuz", "Ağustos", "Eylül", "Ekim",
           "Kasım", "Aralık"),
    "de": ("Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September", "Oktober",
           "November", "Dezember"),
}

# Table columns: (header, role). Roles: no, desc, qty, price, rate, tax (line tax), amount.
_COLUMNS: dict[str, tuple[tuple[tuple[str, str], ...], ...]] = {
    "en": (
        (("Description", "desc"), ("Qty", "qty"), ("Unit Price", "price"), ("VAT %", "rate"),
         ("Amount", "amount")),
        (("#", "no"), ("Item", "desc"), ("Quantity", "qty"), ("Price", "price"), ("Tax", "rate"),
         ("Line Total", "amount")),
        (("Description", "desc"), ("Qty", "qty"), ("Unit Price", "price"), ("Amount", "amount"),
         ("VAT", "rate")),
    ),
    "tr": (
        (("Sıra No", "no"), ("Mal Hizmet", "desc"), ("Miktar", "qty"), ("Birim Fiyat", "price"),
         ("KDV Oranı", "rate"), ("KDV Tutarı", "tax"), ("Mal Hizmet Tutarı", "amount")),
        (("Açıklama", "desc"), ("Miktar", "qty"), ("Birim Fiyat", "price"), ("KDV %", "rate"),
         ("Tutar", "amount")),
    ),
    "de": (
        (("Pos.", "no"), ("Bezeichnung", "desc"), ("Menge", "qty"), ("Einzelpreis", "price"),
         ("MwSt.", "rate"), ("Gesamtpreis", "amount")),
        (("Beschreibung", "desc"), ("Menge", "qty"), ("E-Preis", "price"), ("USt. %", "rate"),
         ("MwSt.-Betrag", "tax"), ("Betrag", "amount")),
    ),
}

_UNITS = {
    "en": {"piece": ("pcs", "units", ""), "hour": ("hrs", "h"), "kg": ("kg",), "service": ("", "lot")},
    "tr": {"piece": ("Adet", "adet"), "hour": ("Saat",), "kg": ("Kg", "kg"), "service": ("", "Adet")},
    "de": {"piece": ("Stk.", "St."), "hour": ("Std.", "h"), "kg": ("kg",), "service": ("", "pausch.")},
}

# (kind, lowest price, highest price, en, tr, de)
_CATALOG: tuple[tuple[str, int, int, str, str, str], ...] = (
    ("piece", 80, 900, "Office chair, ergonomic, black with armrests",
     "Ofis sandalyesi, ergonomik, siyah, kolçaklı", "Bürostuhl ergonomisch, schwarz, mit Armlehnen"),
    ("piece", 3, 40, "Printer paper A4 80g, box of 5 reams",
     "A4 fotokopi kağıdı 80 gr, 5'li koli", "Kopierpapier A4 80 g, Karton mit 5 Paketen"),
    ("hour", 60, 250, "Consulting services, ERP integration workshop",
     "Danışmanlık hizmeti, ERP entegrasyon çalıştayı", "Beratungsleistung ERP-Integration, Workshop"),
    ("piece", 90, 400, "Laptop docking station USB-C with power supply",
     "Laptop yerleştirme istasyonu USB-C, adaptörlü", "Laptop-Dockingstation USB-C mit Netzteil"),
    ("service", 500, 12000, "Annual software maintenance and support subscription",
     "Yıllık yazılım bakım ve destek hizmeti", "Jährliche Softwarewartung und Support"),
    ("service", 300, 4500, "Freight charges Istanbul to Hamburg, full truck load",
     "Nakliye bedeli İstanbul - Hamburg, komple tır", "Frachtkosten Istanbul nach Hamburg, Komplettladung"),
    ("service", 200, 3000, "Cloud hosting, production cluster (monthly)",
     "Bulut sunucu hizmeti, üretim ortamı (aylık)", "Cloud-Hosting Produktionscluster (monatlich)"),
    ("hour", 25, 60, "Office cleaning services", "Ofis temizlik hizmeti", "Reinigung der Büroräume"),
    ("piece", 4, 30, "Stainless steel screws M6, pack of 100",
     "Paslanmaz çelik vida M6, 100'lü paket", "Edelstahlschrauben M6, 100er Pack"),
    ("piece", 25, 120, "Toner cartridge, black, high yield",
     "Toner kartuşu, siyah, yüksek kapasiteli", "Tonerkartusche schwarz, hohe Reichweite"),
    ("kg", 2, 15, "Industrial cleaning agent, concentrate",
     "Endüstriyel temizlik maddesi, konsantre", "Industriereiniger Konzentrat"),
    ("hour", 70, 180, "On-site installation and commissioning",
     "Yerinde kurulum ve devreye alma", "Montage und Inbetriebnahme vor Ort"),
    ("piece", 150, 2500, "27 inch monitor, IPS panel, height adjustable stand",
     "27 inç monitör, IPS panel, yükseklik ayarlı", "27-Zoll-Monitor, IPS-Panel, höhenverstellbar"),
    ("service", 100, 900, "Travel expenses as agreed",
     "Anlaşmaya göre seyahat giderleri", "Reisekosten laut Vereinbarung"),
    ("kg", 1, 8, "Packaging material, stretch film", "Ambalaj malzemesi, streç film",
     "Verpackungsmaterial, Stretchfolie"),
    ("piece", 5, 60, "Ethernet cable Cat6, 5 m, grey", "Ethernet kablosu Cat6, 5 m, gri",
     "Netzwerkkabel Cat6, 5 m, grau"),
)

_COMPANIES = {
    "TR": ("Anadolu Lojistik A.Ş.", "Ege Tekstil San. ve Tic. Ltd. Şti.", "Boğaziçi Yazılım Hizmetleri A.Ş.",
           "Karadeniz Gıda Ltd. Şti.", "Marmara Ofis Malzemeleri A.Ş.", "Toros Makina Sanayi A.Ş.",
           "Kapadokya Turizm Ltd. Şti.", "Akdeniz Enerji A.Ş."),
    "DE": ("Müller & Söhne GmbH", "Schneider Logistik AG", "Becker IT-Service GmbH", "Hoffmann Bürobedarf KG",
           "Weber Maschinenbau GmbH", "Fischer & Partner Steuerberatung",
           "Wagner Elektrotechnik GmbH & Co. KG", "Nordlicht Software GmbH"),
    "GB": ("Thames Office Supplies Ltd", "Pennine Freight Services Ltd", "Albion Software Consulting LLP",
           "Brackley Engineering plc", "Greenwich Data Systems Ltd", "Harbour & Quay Trading Ltd",
           "Cotswold Print Works Ltd", "Northgate Facilities Management Ltd"),
}

_STREETS = {
    "TR": ("Atatürk Cad. No:12", "Cumhuriyet Mah. 1203. Sok. No:5", "Büyükdere Cad. No:201 Kat:4",
           "İnönü Bulvarı No:48", "Organize Sanayi Bölgesi 3. Cad. No:7"),
    "DE": ("Hauptstraße 5", "Industriestraße 22a", "Am Hafen 7", "Königsallee 60", "Gewerbepark 3"),
    "GB": ("12 King Street", "Unit 4, Riverside Park", "221 Baker Street", "3 Quay Road",
           "40 Station Approach"),
}
_CITIES = {
    "TR": (("34394 Şişli / İstanbul", "Şişli"), ("35210 Konak / İzmir", "Konak"),
           ("06510 Çankaya / Ankara", "Çankaya"), ("16140 Nilüfer / Bursa", "Nilüfer"),
           ("07100 Muratpaşa / Antalya", "Muratpaşa")),
    "DE": (("10115 Berlin", ""), ("20457 Hamburg", ""), ("80331 München", ""), ("40212 Düsseldorf", ""),
           ("50667 Köln", "")),
    "GB": (("London EC2V 8AA", ""), ("Manchester M1 1AE", ""), ("Leeds LS1 4DY", ""), ("Bristol BS1 6QA", ""),
           ("Oxford OX1 2JD", "")),
}
_BANKS = {
    "TR": (("00010", "TCZBTR2A", "Ziraat Bankası"), ("00062", "TGBATRIS", "Garanti BBVA"),
           ("00064", "ISBKTRIS", "Türkiye İş Bankası"), ("00046", "AKBKTRIS", "Akbank")),
    "DE": (("37040044", "COBADEFFXXX", "Commerzbank"), ("10070000", "DEUTDEBBXXX", "Deutsche Bank"),
           ("50010517", "INGDDEFFXXX", "ING"), ("20050550", "HASPDEHHXXX", "Hamburger Sparkasse")),
    "GB": (("NWBK601613", "NWBKGB2L", "NatWest"), ("BARC200000", "BARCGB22", "Barclays"),
           ("LOYD309634", "LOYDGB2L", "Lloyds Bank"), ("MIDL400515", "MIDLGB22", "HSBC UK")),
}
_PHONE_PREFIX = {"TR": "+90 212 ", "DE": "+49 30 ", "GB": "+44 20 "}
_MAIL_DOMAIN = {"TR": ".com.tr", "DE": ".de", "GB": ".co.uk"}
_RATES = {"TR": (20, 20, 20, 10, 1), "DE": (19, 19, 19, 7), "GB": (20, 20, 20, 5, 0)}
_CURRENCIES = {"TR": ("TRY", "TRY", "TRY", "TRY", "EUR", "USD"), "DE": ("EUR",) * 8 + ("USD",),
               "GB": ("GBP",) * 6 + ("EUR", "USD")}
_MARKS = {"TRY": ("TRY", "TL", "₺"), "EUR": ("EUR", "€"), "USD": ("USD", "$"), "GBP": ("GBP", "£")}
_ASCII = str.maketrans({"ü": "ue", "ö": "oe", "ä": "ae", "ß": "ss", "ş": "s", "ı": "i", "ğ": "g", "ç": "c",
                        "Ş": "s", "İ": "i", "Ö": "o", "Ü": "u", "Ç": "c", "&": ""})


# ---------------------------------------------------------------------------------------------
# building a document
# ---------------------------------------------------------------------------------------------

def _sample(*, key: str, kind: str, rng: random.Random) -> Sample:
    defect: str | None = None
    if kind == "defective":
        defect = rng.choice((TOTALS_MISMATCH, BAD_IBAN_CHECKSUM))
    doc = _document(rng, defect=defect)
    layout = rng.choice(LAYOUTS)
    lines = _RENDERERS[layout](doc, rng)
    if kind == UNREADABLE:
        text = _finish(_garbled(doc, lines, rng))
        return Sample(key=key, text=text, truth=None, expected_state=FAILED_TERMINAL, defect=UNREADABLE,
                      layout=layout, language=doc.lang)
    state = SUCCEEDED if defect is None else REVIEW_REQUIRED
    return Sample(key=key, text=_finish(lines), truth=doc.truth(), expected_state=state, defect=defect,
                  layout=layout, language=doc.lang)


def _finish(lines: Sequence[str]) -> str:
    """No trailing blanks (they would force YAML out of block style), one final newline."""
    return "\n".join(line.rstrip() for line in lines).strip("\n") + "\n"


def _document(rng: random.Random, *, defect: str | None) -> _Doc:
    country = rng.choice(("TR", "TR", "DE", "DE", "GB", "GB", "GB"))
    lang = {"TR": "tr", "DE": "de", "GB": "en"}[country]
    if country != "GB" and rng.random() < 0.15:
        lang = "en"
    buyer_country = country if rng.random() < 0.75 else rng.choice(("TR", "DE", "GB"))
    supplier = _party(rng, country=country, with_vat=True)
    buyer = _party(rng, country=buyer_country, with_vat=rng.random() < 0.85, not_named=supplier.name)
    if lang == "en" and country == "GB":
        decimal_comma = rng.random() < 0.05
    elif lang == "en":
        decimal_comma = rng.random() < 0.5
    else:
        decimal_comma = rng.random() < 0.9
    currency = rng.choice(_CURRENCIES[country])
    issue = dt.date(2025, 1, 1) + dt.timedelta(days=rng.randrange(730))
    due = issue + dt.timedelta(days=rng.choice((0, 7, 14, 30, 30, 45, 60))) if rng.random() < 0.75 else None

    items = tuple(_item(rng, lang=lang, country=country) for _ in range(_item_count(rng)))
    subtotal = sum((item.amount for item in items), decimal.Decimal(0))
    tax_total = sum((item.tax for item in items), decimal.Decimal(0))
    total = subtotal + tax_total
    if defect == TOTALS_MISMATCH:
        total = _misprinted(total, subtotal=subtotal, rng=rng)

    bank_code, bic, bank = rng.choice(_BANKS[country])
    iban: str | None = _iban(rng, country=country, bank_code=bank_code)
    if defect == BAD_IBAN_CHECKSUM:
        iban = _broken_iban(iban or "", rng)
    elif rng.random() < 0.1:
        iban = None
    currency_field = rng.random() < 0.35
    mark_on = rng.choice(("all", "total", "none")) if currency_field else rng.choice(("all", "total"))
    return _Doc(
        lang=lang,
        decimal_comma=decimal_comma,
        grouped=rng.random() < 0.85,
        number=_invoice_number(rng, country=country, year=issue.year),
        issue=issue,
        due=due,
        date_style=rng.choice(("dots", "iso", "long")),
        currency=currency,
        mark=rng.choice(_MARKS[currency]),
        mark_before=rng.random() < 0.3,
        mark_on=mark_on,
        currency_field=currency_field,
        supplier=supplier,
        buyer=buyer,
        iban=iban,
        iban_grouped=rng.random() < 0.8,
        bic=bic,
        bank=bank,
        items=items,
        subtotal=subtotal,
        tax_total=tax_total,
        total=total,
        order_no=_order_number(rng) if rng.random() < 0.5 else None,
        rate_style=rng.choice(("plain", "spaced")),
    )


def _item_count(rng: random.Random) -> int:
    return rng.choice((1, 2, 2, 3, 3, 3, 4, 4, 5, 6, 7, 9, 12))


def _item(rng: random.Random, *, lang: str, country: str) -> _Item:
    kind, low, high, en, tr, de = rng.choice(_CATALOG)
    description = {"en": en, "tr": tr, "de": de}[lang]
    if kind == "hour":
        quantity = decimal.Decimal(rng.randint(1, 80)) / 2
    elif kind == "kg":
        quantity = decimal.Decimal(rng.randint(4, 2000)) / 4 if rng.random() < 0.5 else decimal.Decimal(
            rng.randint(1, 500))
    elif kind == "service":
        quantity = decimal.Decimal(rng.choice((1, 1, 1, 2, 3, 12)))
    else:
        quantity = decimal.Decimal(rng.choice((1, 1, 2, 3, 4, 5, 6, 10, 12, 20, 24, 50, 100, 250)))
    quantity = quantity.normalize()
    ceiling = high if rng.random() < 0.4 else low + (high - low) // 5 + 1  # integers only: same on every libm
    if rng.random() < 0.3:
        unit_price = decimal.Decimal(rng.randint(low, ceiling)).quantize(_CENT)
    else:
        unit_price = decimal.Decimal(rng.randint(low * 100, ceiling * 100)) / 100
    amount = _round(quantity * unit_price)
    rate = rng.choice(_RATES[country])
    tax = _round(amount * rate / _HUNDRED)
    unit = rng.choice(_UNITS[lang][kind])
    return _Item(description=description, quantity=quantity, unit=unit, unit_price=unit_price, amount=amount,
                 rate=rate, tax=tax)


def _misprinted(total: decimal.Decimal, *, subtotal: decimal.Decimal, rng: random.Random) -> decimal.Decimal:
    """A printed total that is visibly not subtotal + tax (off by far more than a rounding cent)."""
    while True:
        how = rng.choice(("tax_forgotten", "typo", "off_by", "transposed"))
        if how == "tax_forgotten":
            wrong = subtotal
        elif how == "typo":
            wrong = total + rng.choice((1, -1)) * decimal.Decimal(10) ** rng.randint(0, 2)
        elif how == "off_by":
            wrong = total + decimal.Decimal(rng.randint(2, 9999)) / 100
        else:
            digits = list(f"{total:.2f}".replace(".", ""))
            position = rng.randrange(len(digits) - 1)
            digits[position], digits[position + 1] = digits[position + 1], digits[position]
            wrong = decimal.Decimal("".join(digits)) / 100
        if wrong > 0 and abs(wrong - total) > decimal.Decimal("0.05"):
            return wrong.quantize(_CENT)


def _party(rng: random.Random, *, country: str, with_vat: bool, not_named: str = "") -> _Party:
    name = rng.choice([n for n in _COMPANIES[country] if n != not_named])
    city, tax_office = rng.choice(_CITIES[country])
    vat_id: str | None = None
    vat_printed: str | None = None
    if with_vat:
        vat_id = _vat_id(rng, country=country)
        vat_printed = vat_id
        if country == "GB" and rng.random() < 0.4:
            vat_printed = f"{vat_id[:2]} {vat_id[2:5]} {vat_id[5:9]} {vat_id[9:]}"
    slug = name.split()[0].lower().translate(_ASCII).strip(",.")
    phone = _PHONE_PREFIX[country] + " ".join(
        str(rng.randint(100, 999)) if index == 0 else f"{rng.randint(0, 99):02d}" for index in range(3))
    return _Party(
        name=name,
        country=country,
        vat_id=vat_id,
        vat_printed=vat_printed,
        address=(rng.choice(_STREETS[country]), city),
        phone=phone,
        email=f"info@{slug}{_MAIL_DOMAIN[country]}",
        tax_office=tax_office or None,
    )


def _vat_id(rng: random.Random, *, country: str) -> str:
    if country == "TR":
        digits = [rng.randint(0, 9) for _ in range(9)]
        return "".join(map(str, digits)) + str(_vkn_check(digits))
    if country == "DE":
        digits = [rng.randint(1, 9)] + [rng.randint(0, 9) for _ in range(7)]
        return "DE" + "".join(map(str, digits)) + str(_de_vat_check(digits))
    digits = [rng.randint(1, 9)] + [rng.randint(0, 9) for _ in range(6)]
    weighted = sum(d * w for d, w in zip(digits, range(8, 1, -1), strict=True))
    return "GB" + "".join(map(str, digits)) + f"{-weighted % 97:02d}"


def _vkn_check(digits: Sequence[int]) -> int:
    """Check digit of a Turkish tax number (VKN) from its first nine digits."""
    total = 0
    for index, digit in enumerate(digits):
        shifted = (digit + 9 - index) % 10
        total += 9 if shifted == 9 else (shifted * 2 ** (9 - index)) % 9
    return (10 - total % 10) % 10


def _de_vat_check(digits: Sequence[int]) -> int:
    """Check digit of a German USt-IdNr. (ISO 7064 MOD 11,10) from its first eight digits."""
    product = 10
    for digit in digits:
        total = (digit + product) % 10 or 10
        product = (2 * total) % 11
    return (11 - product) % 10


def _iban(rng: random.Random, *, country: str, bank_code: str) -> str:
    if country == "TR":
        bban = bank_code + "0" + "".join(str(rng.randint(0, 9)) for _ in range(16))
    elif country == "DE":
        bban = bank_code + "".join(str(rng.randint(0, 9)) for _ in range(10))
    else:
        bban = bank_code + "".join(str(rng.randint(0, 9)) for _ in range(8))
    return country + iban_check_digits(country=country, bban=bban) + bban


def iban_check_digits(*, country: str, bban: str) -> str:
    """ISO 13616 check digits: 98 - (BBAN + country + "00", letters as 10..35) mod 97."""
    return f"{98 - _mod97(bban + country + '00'):02d}"


def iban_is_valid(iban: str) -> bool:
    """The mod-97 check of a compact IBAN (no length rules)."""
    return len(iban) > 4 and iban.isalnum() and _mod97(iban[4:] + iban[:4]) == 1


def _mod97(text: str) -> int:
    return int("".join(str(int(char, 36)) for char in text.upper())) % 97


def _broken_iban(iban: str, rng: random.Random) -> str:
    """One digit of the account number misprinted: mod 97 catches every single-digit error."""
    while True:
        position = rng.randrange(len(iban) - 8, len(iban))
        replacement = str(rng.randint(0, 9))
        broken = iban[:position] + replacement + iban[position + 1:]
        if not iban_is_valid(broken):
            return broken


def _invoice_number(rng: random.Random, *, country: str, year: int) -> str:
    serial = rng.randint(1, 99999)
    if country == "TR":
        prefix = rng.choice(("GIB", "ABC", "EAR", "FTR"))
        return rng.choice((f"{prefix}{year}{serial:09d}", f"FTR-{year}-{serial:05d}"))
    if country == "DE":
        return rng.choice((f"RE-{year}-{serial:05d}", f"{year}-{serial:05d}", f"R{year % 100}{serial:05d}"))
    return rng.choice((f"INV-{year}-{serial:05d}", f"INV/{year % 100}/{serial:05d}", f"{serial + 100000}"))


def _order_number(rng: random.Random) -> str:
    return rng.choice(("PO", "SP", "B", "C")) + "-" + str(rng.randint(10000, 99999))


# ---------------------------------------------------------------------------------------------
# printing values
# ---------------------------------------------------------------------------------------------

def _amount(doc: _Doc, value: decimal.Decimal, *, mark: bool = False) -> str:
    whole, cents = f"{value:.2f}".split(".")
    thousands, point = (".", ",") if doc.decimal_comma else (",", ".")
    if doc.grouped:
        groups: list[str] = []
        while len(whole) > 3:
            groups.insert(0, whole[-3:])
            whole = whole[:-3]
        whole = thousands.join([whole, *groups])
    text = f"{whole}{point}{cents}"
    if not mark:
        return text
    if doc.mark_before:
        return f"{doc.mark}{text}" if len(doc.mark) == 1 else f"{doc.mark} {text}"
    return f"{text} {doc.mark}"


def _quantity(doc: _Doc, value: decimal.Decimal) -> str:
    text = _plain(value)
    return text.replace(".", ",") if doc.decimal_comma else text


def _rate(doc: _Doc, rate: int) -> str:
    if doc.lang == "tr":
        return f"%{rate}"
    return f"{rate} %" if doc.lang == "de" and doc.rate_style == "spaced" else f"{rate}%"


def _date(doc: _Doc, value: dt.date) -> str:
    if doc.date_style == "dots":
        return f"{value.day:02d}.{value.month:02d}.{value.year}"
    if doc.date_style == "iso":
        return value.isoformat()
    month = _MONTHS[doc.lang][value.month - 1]
    return f"{value.day}. {month} {value.year}" if doc.lang == "de" else f"{value.day} {month} {value.year}"


def _iban_text(doc: _Doc) -> str:
    iban = doc.iban or ""
    if not doc.iban_grouped:
        return iban
    return " ".join(iban[index:index + 4] for index in range(0, len(iban), 4))


def _words(doc: _Doc, role: str, rng: random.Random) -> str:
    return rng.choice(_WORDS[doc.lang][role])


# ---------------------------------------------------------------------------------------------
# noise: only ever applied to text no value is read from
# ---------------------------------------------------------------------------------------------

_SEPARATORS = (": ", ": ", ": ", ": ", " : ", ":  ", ".: ", ":: ", "  ")


def _kv(label: str, value: str, rng: random.Random) -> str:
    """`Label: value` with a noisy separator (`Invoice No .: INV-1`, `Date  12.03.2026`)."""
    return label + rng.choice(_SEPARATORS) + value


def _noisy(text: str, rng: random.Random) -> str:
    """Free text with at most one OCR slip: a doubled space, an O/0 swap or a stray mark."""
    roll = rng.random()
    if roll < 0.15 and " " in text:
        spaces = [index for index, char in enumerate(text) if char == " "]
        index = rng.choice(spaces)
        return text[:index] + " " + text[index:]
    if roll < 0.3:
        zeros = [index for index, char in enumerate(text) if char == "0" and text[index - 1:index].isalnum()]
        if zeros:
            index = rng.choice(zeros)
            return text[:index] + "O" + text[index + 1:]
        ohs = [index for index, char in enumerate(text) if char in "oO" and text[index - 1:index].isalpha()]
        if ohs:
            index = rng.choice(ohs)
            return text[:index] + "0" + text[index + 1:]
    if roll < 0.4:
        spaces = [index for index, char in enumerate(text) if char == " "]
        if spaces:
            index = rng.choice(spaces)
            return text[:index] + rng.choice((" ·", ",", " '", "`", " .")) + text[index:]
        return text + rng.choice((".", " ,", "'"))
    return text


def _wrapped(text: str, rng: random.Random, *, indent: str = "") -> list[str]:
    """Free text broken into lines at a random width, as OCR does with a wide paragraph."""
    width = rng.randint(28, 72)
    lines: list[str] = []
    current = ""
    for word in text.split(" "):
        if current and len(current) + 1 + len(word) > width:
            lines.append(indent + current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    lines.append(indent + current)
    return lines


def _notes(doc: _Doc, rng: random.Random) -> list[str]:
    count = rng.randint(1, 3)
    chosen = rng.sample(_WORDS[doc.lang]["notes"], count)
    text = " ".join(note.format(days=rng.choice((14, 30, 45))) for note in chosen)
    return _wrapped(_noisy(text, rng), rng)


# ---------------------------------------------------------------------------------------------
# blocks shared by the layouts
# ---------------------------------------------------------------------------------------------

def _header_fields(doc: _Doc, rng: random.Random) -> list[tuple[str, str]]:
    """(label, value) pairs in print order; distractors (order no, delivery date) included."""
    fields = [(_words(doc, "number", rng), doc.number), (_words(doc, "issue", rng), _date(doc, doc.issue))]
    if doc.due is not None:
        fields.append((_words(doc, "due", rng), _date(doc, doc.due)))
    extras: list[tuple[str, str]] = []
    if doc.order_no is not None:
        extras.append((_words(doc, "order", rng), doc.order_no))
    if rng.random() < 0.3:
        offset = dt.timedelta(days=rng.randint(0, 5))
        extras.append((_words(doc, "delivery", rng), _date(doc, doc.issue - offset)))
    if doc.currency_field:
        extras.append((_words(doc, "currency", rng), doc.currency))
    rng.shuffle(extras)
    return fields + extras


def _party_lines(doc: _Doc, party: _Party, rng: random.Random, *, supplier: bool) -> list[str]:
    """Name, address and VAT id of one party (no label): the body of a party block."""
    lines = [party.name, *(_noisy(line, rng) for line in party.address)]
    if rng.random() < 0.5:
        lines.append(_noisy(f"{_words(doc, 'tel', rng)}: {party.phone}", rng))
    if party.vat_printed is not None:
        vat = _kv(_words(doc, "vat", rng), party.vat_printed, rng)
        if party.tax_office and doc.lang == "tr" and rng.random() < 0.5:
            vat = f"V.D.: {party.tax_office}  {vat}"
        lines.append(vat)
    if supplier and rng.random() < 0.4:
        lines.append(_noisy(party.email, rng))
    return lines


def _bank_lines(doc: _Doc, rng: random.Random) -> list[str]:
    if doc.iban is None:
        return []
    heading = _words(doc, "bank", rng)
    iban = f"IBAN{rng.choice((': ', ' ', ':  '))}{_iban_text(doc)}"
    if rng.random() < 0.5:
        return [f"{heading}:", doc.bank, f"{iban}  BIC: {doc.bic}"]
    return [f"{heading}: {doc.bank} · {iban} · BIC {doc.bic}"]


def _tax_label(doc: _Doc, rate: int, rng: random.Random) -> str:
    label = _words(doc, "tax", rng)
    if doc.lang == "de" and rng.random() < 0.3:
        return f"zzgl. {_rate(doc, rate)} {label}"
    if doc.lang == "tr":
        return f"{label} ({_rate(doc, rate)})" if rng.random() < 0.6 else f"{label} {_rate(doc, rate)}"
    return f"{label} {_rate(doc, rate)}" if rng.random() < 0.6 else f"{label} ({_rate(doc, rate)})"


def _totals(doc: _Doc, rng: random.Random) -> list[tuple[str, str]]:
    """(label, amount) rows: subtotal, tax per rate (+ tax total when several rates), total."""
    marks = {"all": (True, True), "total": (False, True), "none": (False, False)}[doc.mark_on]
    rows = [(_words(doc, "subtotal", rng), _amount(doc, doc.subtotal, mark=marks[0]))]
    rates = sorted({item.rate for item in doc.items}, reverse=True)
    if len(rates) == 1 and rng.random() < 0.6:
        rows.append((_tax_label(doc, rates[0], rng), _amount(doc, doc.tax_total, mark=marks[0])))
    elif len(rates) == 1:
        rows.append((_words(doc, "tax_total", rng), _amount(doc, doc.tax_total, mark=marks[0])))
    else:
        for rate in rates:
            tax = sum((item.tax for item in doc.items if item.rate == rate), decimal.Decimal(0))
            rows.append((_tax_label(doc, rate, rng), _amount(doc, tax, mark=marks[0])))
        rows.append((_words(doc, "tax_total", rng), _amount(doc, doc.tax_total, mark=marks[0])))
    rows.append((_words(doc, "total", rng), _amount(doc, doc.total, mark=marks[1])))
    return rows


def _split_description(text: str, rng: random.Random, *, width: int) -> list[str]:
    """The description in one or two parts, split at a space; the second part starts with a letter."""
    if len(text) <= width and rng.random() < 0.75:
        return [text]
    cuts = [index for index, char in enumerate(text)
            if char == " " and 8 <= index <= width and text[index + 1].isalpha()]
    if not cuts:
        return [text]
    cut = max(cuts) if len(text) > width else rng.choice(cuts)
    return [text[:cut], text[cut + 1:]]


def _cells(doc: _Doc, item: _Item, number: int) -> dict[str, str]:
    return {
        "no": f"{number}",
        "qty": _quantity(doc, item.quantity),
        "price": _amount(doc, item.unit_price),
        "rate": _rate(doc, item.rate),
        "tax": _amount(doc, item.tax),
        "amount": _amount(doc, item.amount),
    }


def _table_rows(doc: _Doc, rng: random.Random, *, width: int) -> list[dict[str, str]]:
    """One dict per printed row; a continued description adds a row with only `desc`."""
    rows = []
    step = rng.choice((1, 1, 1, 10))
    for index, item in enumerate(doc.items):
        parts = _split_description(item.description, rng, width=width)
        rows.append({**_cells(doc, item, (index + 1) * step), "desc": parts[0]})
        rows.extend({"desc": part} for part in parts[1:])
    return rows


def _plain_table(doc: _Doc, rng: random.Random) -> list[str]:
    columns = rng.choice(_COLUMNS[doc.lang])
    rows = _table_rows(doc, rng, width=rng.randint(24, 40))
    widths = [max([len(header)] + [len(row.get(role, "")) for row in rows]) for header, role in columns]
    gap = " " * rng.randint(2, 4)

    def line(cells: dict[str, str], *, headers: bool = False) -> str:
        out = []
        for (header, role), width in zip(columns, widths, strict=True):
            cell = header if headers else cells.get(role, "")
            out.append(cell.ljust(width) if role in ("desc", "no") else cell.rjust(width))
        return gap.join(out)

    header = line({}, headers=True)
    rule = rng.choice("-=_") * len(header)
    return [header, rule, *(line(row) for row in rows), rule]


def _boxed_table(doc: _Doc, rng: random.Random) -> list[str]:
    columns = rng.choice(_COLUMNS[doc.lang])
    roles = [role for _, role in columns]
    rows = _table_rows(doc, rng, width=rng.randint(22, 34))
    widths = [max([len(header)] + [len(row.get(role, "")) for row in rows]) for header, role in columns]
    border = "+" + "+".join("-" * (width + 2) for width in widths) + "+"

    def line(cells: list[str], roles_: Sequence[str]) -> str:
        out = []
        for cell, role, width in zip(cells, roles_, widths, strict=True):
            padded = cell.ljust(width) if role in ("desc", "no", "head") else cell.rjust(width)
            out.append(f" {padded} ")
        return "|" + "|".join(out) + "|"

    headers = line([header for header, _ in columns], ["head"] * len(columns))
    lines = [border, headers, border.replace("-", "=")]
    lines += [line([row.get(role, "") for role in roles], roles) for row in rows]
    lines.append(border)
    return lines


def _record_items(doc: _Doc, rng: random.Random) -> list[str]:
    lines = [f"{_words(doc, 'items', rng)}:"]
    times = "×" if doc.lang == "de" and rng.random() < 0.5 else "x"
    tax_word = {"en": "VAT", "tr": "KDV", "de": "MwSt."}[doc.lang]
    marked = rng.random() < 0.4
    width = rng.randint(30, 48)
    for index, item in enumerate(doc.items, start=1):
        parts = _split_description(item.description, rng, width=width)
        lines.append(f"{index}. {parts[0]}" if rng.random() < 0.7 else f"{index}) {parts[0]}")
        lines.extend(f"   {part}" for part in parts[1:])
        quantity = _quantity(doc, item.quantity) + (f" {item.unit}" if item.unit else "")
        price = _amount(doc, item.unit_price, mark=marked)
        amount = _amount(doc, item.amount, mark=marked)
        lines.append(f"   {quantity} {times} {price} = {amount} ({tax_word} {_rate(doc, item.rate)})")
        if rng.random() < 0.2:
            lines.append("")
    return lines


# ---------------------------------------------------------------------------------------------
# layouts
# ---------------------------------------------------------------------------------------------

def _ledger(doc: _Doc, rng: random.Random) -> list[str]:
    """Title, stacked header fields and party blocks, whitespace table, `Label: amount` totals."""
    header = [_kv(label, value, rng) for label, value in _header_fields(doc, rng)]
    supplier_label = _words(doc, "supplier", rng)
    supplier = [f"{supplier_label}:", *_party_lines(doc, doc.supplier, rng, supplier=True)]
    iban_in_party = doc.iban is not None and rng.random() < 0.5
    if iban_in_party:
        supplier.append(f"IBAN: {_iban_text(doc)}")
    buyer_label = _words(doc, "buyer", rng)
    body = _party_lines(doc, doc.buyer, rng, supplier=False)
    if buyer_label == "Sayın":
        buyer = [buyer_label, *body]
    elif rng.random() < 0.3:
        buyer = [f"{buyer_label}: {body[0]}", *body[1:]]
    else:
        buyer = [f"{buyer_label}:", *body]

    title = _words(doc, "title", rng)
    lines = [" " * rng.randint(0, 24) + title, ""]
    if rng.random() < 0.5:
        lines += [*header, "", *supplier, "", *buyer]
    else:
        lines += [*supplier, "", *buyer, "", *header]
    lines += ["", *_plain_table(doc, rng), ""]
    totals = _totals(doc, rng)
    width = max(len(label) for label, _ in totals) + rng.randint(2, 6)
    amount_width = max(len(amount) for _, amount in totals)
    indent = " " * rng.randint(0, 30)
    for label, amount in totals:
        lines.append(indent + f"{label}:".ljust(width) + amount.rjust(amount_width))
    lines += ["", *_notes(doc, rng)]
    if not iban_in_party:
        lines += ["", *_bank_lines(doc, rng)]
    if rng.random() < 0.5:
        lines += ["", _words(doc, "page", rng)]
    return lines


def _two_column(doc: _Doc, rng: random.Random) -> list[str]:
    """Header fields in pairs, parties side by side, numbered item records, dot-leader totals."""
    title = _words(doc, "title", rng)
    lines = [" " * rng.randint(10, 30) + title, ""]
    fields = [_kv(label, value, rng) for label, value in _header_fields(doc, rng)]
    column = max(len(field) for field in fields[0::2]) + rng.randint(3, 10)
    for index in range(0, len(fields), 2):
        pair = fields[index:index + 2]
        lines.append(pair[0].ljust(column) + pair[1] if len(pair) == 2 else pair[0])
    lines.append("")

    left = [f"{_words(doc, 'supplier', rng)}:", *_party_lines(doc, doc.supplier, rng, supplier=True)]
    buyer_label = _words(doc, "buyer", rng)
    right = [buyer_label if buyer_label == "Sayın" else f"{buyer_label}:",
             *_party_lines(doc, doc.buyer, rng, supplier=False)]
    width = max(len(line) for line in left) + rng.randint(4, 10)
    for index in range(max(len(left), len(right))):
        left_cell = left[index] if index < len(left) else ""
        right_cell = right[index] if index < len(right) else ""
        lines.append(left_cell.ljust(width) + right_cell if right_cell else left_cell)
    lines.append("")

    lines += _record_items(doc, rng)
    lines += ["", "-" * rng.randint(30, 60)]
    totals = _totals(doc, rng)
    width = max(len(label) for label, _ in totals) + rng.randint(6, 16)
    for label, amount in totals:
        lines.append(f"{label} ".ljust(width, ".") + " " + amount)
    lines += ["", *_notes(doc, rng), "", *_bank_lines(doc, rng)]
    return lines


def _letterhead(doc: _Doc, rng: random.Random) -> list[str]:
    """Unlabelled supplier letterhead, header labels above their values, boxed table."""
    supplier = doc.supplier
    contact = f"{supplier.address[0]} · {supplier.address[1]} · {_words(doc, 'tel', rng)} {supplier.phone}"
    lines = [supplier.name, *_wrapped(_noisy(contact, rng), rng), _noisy(supplier.email, rng)]
    if supplier.vat_printed is not None:
        lines.append(_kv(_words(doc, "vat", rng), supplier.vat_printed, rng))
    buyer_label = _words(doc, "buyer", rng)
    lines += ["", "", buyer_label if buyer_label == "Sayın" else f"{buyer_label}:"]
    lines += _party_lines(doc, doc.buyer, rng, supplier=False)
    lines += ["", " " * rng.randint(0, 20) + _words(doc, "title", rng), ""]

    fields = _header_fields(doc, rng)
    gap = rng.randint(3, 6)
    label_line, value_line = "", ""
    for label, value in fields:
        width = max(len(label), len(value)) + gap
        label_line += label.ljust(width)
        value_line += value.ljust(width)
    lines += [label_line, value_line, ""]

    lines += _boxed_table(doc, rng) if rng.random() < 0.7 else _plain_table(doc, rng)
    lines.append("")
    totals = _totals(doc, rng)
    width = max(len(label) for label, _ in totals) + rng.randint(3, 8)
    amount_width = max(len(amount) for _, amount in totals)
    indent = " " * rng.randint(10, 40)
    for label, amount in totals:
        lines.append(indent + label.ljust(width) + amount.rjust(amount_width))
    lines += ["", *_notes(doc, rng)]
    bank = _bank_lines(doc, rng)
    if len(bank) == 1:
        lines += ["", f"{supplier.name} · {bank[0]}"]
    elif bank:
        lines += ["", *bank]
    return lines


_RENDERERS = {"ledger": _ledger, "two-column": _two_column, "letterhead": _letterhead}


# ---------------------------------------------------------------------------------------------
# unreadable scans
# ---------------------------------------------------------------------------------------------

_GARBAGE = "#%&*~?/\\^_=+<>;:'\"`"


def _garbled(doc: _Doc, lines: Sequence[str], rng: random.Random) -> list[str]:
    """A scan nothing can be read from: no invoice number, no totals, most characters lost."""
    how = rng.choice(("garbled", "garbled", "fragment", "blank"))
    if how == "blank":
        return [rng.choice(_GARBAGE) * rng.randint(3, 20),
                "",
                f"[{rng.choice(_WORDS[doc.lang]['unreadable'])}]",
                " ".join(rng.choice(_GARBAGE) * rng.randint(1, 4) for _ in range(rng.randint(3, 12)))]
    kept = [line for line in lines if not _critical(doc, line)]
    if how == "fragment":
        kept = [*kept[:rng.randint(2, 5)], f"[{rng.choice(_WORDS[doc.lang]['unreadable'])}]"]
        rate = 0.25
    else:
        rate = 0.55
    return ["".join(rng.choice(_GARBAGE) if char.isalnum() and rng.random() < rate else char for char in line)
            for line in kept]


def _critical(doc: _Doc, line: str) -> bool:
    """Lines an extractor could read the invoice number, a total or the IBAN from."""
    needles = [doc.number, *(_amount(doc, value) for value in (doc.subtotal, doc.tax_total, doc.total))]
    if doc.iban is not None:
        needles += [doc.iban[:4], _iban_text(doc)[:9]]
    return any(needle in line for needle in needles)
