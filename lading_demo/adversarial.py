"""
An adversarial invoice corpus: documents, and model answers that look right but are not.

A validation policy is only as good as the wrong answers it has been tried against. The
answers that slip through are not the ones that fail the schema or the arithmetic: they fit
`invoice.v1`, add up, and quote real text of the document for every amount, the IBAN and
the invoice number, and they are still wrong — a currency the document never shows, the
supplier and the buyer swapped, a date read day-for-month, the buyer's VAT id booked as the
supplier's. This module renders documents in every language and layout the policies must
read, and for each one the answers a careful model gives and the single-field corruptions an
adversarial (or merely unlucky) one gives, each with its class and the verdict a correct
policy reaches.

    documents(count, seed=...)        `Document`s cycling through LANGUAGES x LAYOUTS
    document(seed=, language=, layout=)  one document, for property-based tests

Documents:

    languages    en (GB and US suppliers, and suppliers abroad writing English), de, tr, fr,
                 nl, es, it
    layouts      ledger        stacked "Label: value" header, labelled party blocks
                 two-column    header fields in pairs, supplier and buyer side by side
                 letterhead    the supplier unlabelled on top, its bank details in the footer
                 multi-page    letterhead, lines over two or three pages, a repeated page
                               header, page footers and carried-forward subtotals
    kinds        invoices, and credit notes with negative amounts
    features     one tax rate or several (French 5.5 % included), amounts with and without
                 thousands separators (French with spaces), dates as ISO, dd.mm.yyyy,
                 dd/mm/yyyy, dd-mm-yyyy, mm/dd/yyyy (US) and with month names, currencies by
                 ISO code, symbol, header field or not at all, light OCR noise in free text,
                 order numbers, delivery dates and buyers' direct-debit IBANs as distractors

Every document's `truth` is the correct `invoice.v1` answer with evidence for every field,
quoted the way the builtin extractor quotes (the printed value). Most documents are clean:
their truth is expected to SUCCEED. Two kinds of document cannot be booked unreviewed even
when read perfectly, and their truth is expected in review:

    currency_not_shown      no ISO code, symbol or currency field anywhere
    date_reads_two_ways     a numeric date like 03/04/2026 and no locale signal: English,
                            and a supplier with no IBAN and no country-prefixed VAT id
                            (US suppliers; Turkish ones with a bare VKN and no IBAN)

Answers, one per class that applies to the document (see CORRUPTIONS), each differing from
the truth in exactly `Answer.fields`:

    clean                   the truth                                       SUCCEEDED
    currency_absent         a currency the document never shows             REVIEW_REQUIRED
    parties_swapped         supplier and buyer (names, VAT ids) exchanged   REVIEW_REQUIRED
    buyer_is_supplier       the buyer is the supplier again                 REVIEW_REQUIRED
    supplier_name_absent    a supplier name the document never shows        REVIEW_REQUIRED
    issue_date_day_for_month, due_date_day_for_month                        REVIEW_REQUIRED
    issue_date_is_delivery_date  the delivery date, quoted as such          REVIEW_REQUIRED
    due_date_invented       a due date on a document that shows none        REVIEW_REQUIRED
    tax_rate_absent         a line's rate that appears nowhere              REVIEW_REQUIRED
    tax_rate_of_other_line  a line's rate swapped for another printed rate  REVIEW_REQUIRED
    supplier_vat_absent, supplier_vat_of_buyer, buyer_vat_of_supplier       REVIEW_REQUIRED
    iban_of_buyer           the buyer's direct-debit IBAN as the supplier's REVIEW_REQUIRED
    iban_absent             a valid IBAN that appears nowhere               REVIEW_REQUIRED
    invoice_number_is_order_number                                          REVIEW_REQUIRED

Everything is deterministic per seed (integer arithmetic and `random.Random` only). Nothing
in the product's request path imports this module; the judgement is the validation
policy's, and this module only says what a correct one concludes.
"""

# ruff: noqa: RUF001  (the Turkish dotless i and typographic marks are meant, not confusables)

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import decimal
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

SUCCEEDED = "SUCCEEDED"
REVIEW_REQUIRED = "REVIEW_REQUIRED"

LANGUAGES = ("en", "de", "tr", "fr", "nl", "es", "it")
LAYOUTS = ("ledger", "two-column", "letterhead", "multi-page")

CLEAN = "clean"
CURRENCY_NOT_SHOWN = "currency_not_shown"
DATE_READS_TWO_WAYS = "date_reads_two_ways"
DOUBTFUL = (CURRENCY_NOT_SHOWN, DATE_READS_TWO_WAYS)
"""Document classes whose correct answer still needs a human: the document cannot ground it."""

CURRENCY_ABSENT = "currency_absent"
PARTIES_SWAPPED = "parties_swapped"
BUYER_IS_SUPPLIER = "buyer_is_supplier"
SUPPLIER_NAME_ABSENT = "supplier_name_absent"
ISSUE_DATE_DAY_FOR_MONTH = "issue_date_day_for_month"
DUE_DATE_DAY_FOR_MONTH = "due_date_day_for_month"
ISSUE_DATE_IS_DELIVERY_DATE = "issue_date_is_delivery_date"
DUE_DATE_INVENTED = "due_date_invented"
TAX_RATE_ABSENT = "tax_rate_absent"
TAX_RATE_OF_OTHER_LINE = "tax_rate_of_other_line"
SUPPLIER_VAT_ABSENT = "supplier_vat_absent"
SUPPLIER_VAT_OF_BUYER = "supplier_vat_of_buyer"
BUYER_VAT_OF_SUPPLIER = "buyer_vat_of_supplier"
IBAN_OF_BUYER = "iban_of_buyer"
IBAN_ABSENT = "iban_absent"
INVOICE_NUMBER_IS_ORDER_NUMBER = "invoice_number_is_order_number"


@dataclasses.dataclass(frozen=True)
class Answer:
    """One model answer for a document: its class, what it changed, and the correct verdict."""

    case: str
    """`clean`, a doubtful document's class, or a corruption class (see CORRUPTIONS)."""
    fields: tuple[str, ...]
    """The result paths where this answer differs from the truth (empty for the truth)."""
    result: dict[str, Any]
    """An `invoice.v1` result with evidence: it fits the schema and adds up."""
    expected: str
    """SUCCEEDED or REVIEW_REQUIRED."""


@dataclasses.dataclass(frozen=True)
class Document:
    """One rendered document, its correct answer, and the answers to try a policy with."""

    key: str
    text: str
    """The OCR text; pages of a multi-page document are separated by a form feed."""
    truth: dict[str, Any]
    """The correct `invoice.v1` result, with a quote of the source for every field."""
    expected: str
    """What a correct policy concludes for the truth: SUCCEEDED, or REVIEW_REQUIRED when doubtful."""
    doubt: str | None
    """CURRENCY_NOT_SHOWN or DATE_READS_TWO_WAYS when the document itself cannot ground the truth."""
    language: str
    layout: str
    credit_note: bool
    supplier_country: str
    """ISO country of the supplier (`US` has no VAT id and no IBAN)."""
    features: tuple[str, ...]
    """Tags for coverage: `several_rates`, `grouped`, `noise`, `date:<form>`, `currency:<how>`, ..."""
    answers: tuple[Answer, ...]
    """The truth first (class `clean` or the doubt), then one answer per corruption that applies."""


def documents(count: int, *, seed: int) -> list[Document]:
    """`count` documents keyed `adv-0001`..., cycling through every language x layout."""
    if count < 0:
        raise ValueError("count must not be negative")
    master = random.Random(seed)
    combos = [(language, layout) for language in LANGUAGES for layout in LAYOUTS]
    out = []
    for index in range(count):
        language, layout = combos[index % len(combos)]
        out.append(document(seed=master.getrandbits(64), language=language, layout=layout,
                            key=f"adv-{index + 1:04d}"))
    return out


def document(*, seed: int, language: str, layout: str, key: str = "adv-0001") -> Document:
    """One document in `language` and `layout`, everything else drawn from `seed`."""
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {', '.join(LANGUAGES)}, not {language!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    rng = random.Random(seed)
    spec = _spec(rng, language=language, layout=layout)
    text = _RENDERERS[layout](spec, rng)
    truth = _truth(spec)
    for path, quote in truth["evidence"].items():
        if not _occurs(quote, text):  # a generator bug, never a property of the document
            raise AssertionError(f"{key}: the quote for {path} is not in the text")
    doubt = _doubt(spec)
    expected = SUCCEEDED if doubt is None else REVIEW_REQUIRED
    answers = [Answer(case=doubt or CLEAN, fields=(), result=truth, expected=expected)]
    if doubt is None:
        for case, corrupt in CORRUPTIONS.items():
            changed = corrupt(spec, text, copy.deepcopy(truth), random.Random(f"{seed}/{case}"))
            if changed is not None:
                result, fields = changed
                answers.append(Answer(case=case, fields=fields, result=result, expected=REVIEW_REQUIRED))
    return Document(
        key=key, text=text, truth=truth, expected=expected, doubt=doubt, language=language, layout=layout,
        credit_note=spec.credit, supplier_country=spec.supplier.country, features=_features(spec),
        answers=tuple(answers),
    )


def normalised(text: str) -> str:
    """Runs of whitespace (newlines and form feeds included) as one space, as the policies compare."""
    return " ".join(text.split())


def _occurs(quote: str, text: str) -> bool:
    return normalised(quote) in normalised(text)


# ---------------------------------------------------------------------------------------------
# the invoice behind a document
# ---------------------------------------------------------------------------------------------

_CENT = decimal.Decimal("0.01")
_HUNDRED = decimal.Decimal(100)


@dataclasses.dataclass(frozen=True)
class _Party:
    name: str
    country: str
    vat_id: str | None
    vat_printed: str | None
    address: tuple[str, str]
    iban: str | None
    """The supplier's account; for a buyer, the account its direct debit is drawn from."""


@dataclasses.dataclass(frozen=True)
class _Line:
    description: str
    quantity: decimal.Decimal
    unit_price: decimal.Decimal
    amount: decimal.Decimal
    rate: decimal.Decimal


@dataclasses.dataclass(frozen=True)
class _Spec:
    language: str
    layout: str
    credit: bool
    supplier: _Party
    buyer: _Party
    number: str
    order_no: str | None
    issue: dt.date
    due: dt.date | None
    delivery: dt.date | None
    date_form: str
    currency: str
    currency_shown: str
    """`code_after`, `code_before`, `symbol`, `field` or `none`."""
    mark: str
    """The printed code or symbol (`EUR`, `€`, `TL`); empty when not shown."""
    grouped: bool
    lines: tuple[_Line, ...]
    subtotal: decimal.Decimal
    taxes: tuple[tuple[decimal.Decimal, decimal.Decimal], ...]
    """(rate, tax) per rate, highest rate first: tax is the rate applied to that rate's lines' sum."""
    tax_total: decimal.Decimal
    total: decimal.Decimal
    rate_column: bool
    noise: bool
    bank_in_party: bool


_COUNTRY_OF = {"de": "DE", "tr": "TR", "fr": "FR", "nl": "NL", "es": "ES", "it": "IT"}
_RATES = {
    "GB": ("20", "20", "5"), "US": ("8", "8", "6"), "DE": ("19", "19", "7"), "TR": ("20", "20", "10", "1"),
    "FR": ("20", "20", "10", "5.5"), "NL": ("21", "21", "9"), "ES": ("21", "21", "10", "4"),
    "IT": ("22", "22", "10", "4"),
}
_CURRENCIES = {
    "GB": ("GBP", "GBP", "EUR"), "US": ("USD",), "DE": ("EUR",), "TR": ("TRY", "TRY", "EUR", "USD"),
    "FR": ("EUR",), "NL": ("EUR",), "ES": ("EUR",), "IT": ("EUR",),
}
_SYMBOLS = {"EUR": ("€",), "GBP": ("£",), "TRY": ("TL", "₺"), "USD": (), "CHF": ()}
"""Unambiguous symbols only: `$` (and `kr`) name several currencies and are never printed here."""
_DATE_FORMS = {
    "GB": ("iso", "slash_dmy", "slash_dmy", "long"), "US": ("slash_mdy", "slash_mdy", "long_us", "iso"),
    "DE": ("dots", "dots", "iso", "long"), "TR": ("dots", "dots", "slash_dmy", "long"),
    "FR": ("slash_dmy", "slash_dmy", "long"), "NL": ("dash_dmy", "dash_dmy", "long", "iso"),
    "ES": ("slash_dmy", "slash_dmy", "long"), "IT": ("slash_dmy", "slash_dmy", "long"),
}
_NUMERIC_FORMS = frozenset({"dots", "slash_dmy", "slash_mdy", "dash_dmy"})

_COMPANIES = {
    "GB": ("Thames Office Supplies Ltd", "Pennine Freight Services Ltd", "Albion Software Consulting LLP",
           "Brackley Engineering plc", "Cotswold Print Works Ltd"),
    "US": ("Hudson Valley Supply Co.", "Lakeshore Analytics Inc.", "Redwood Freight LLC",
           "Granite State Machining Corp.", "Bayside Office Solutions Inc."),
    "DE": ("Müller & Söhne GmbH", "Schneider Logistik AG", "Becker IT-Service GmbH", "Hoffmann Bürobedarf KG",
           "Nordlicht Software GmbH"),
    "TR": ("Anadolu Lojistik A.Ş.", "Ege Tekstil San. ve Tic. Ltd. Şti.", "Boğaziçi Yazılım Hizmetleri A.Ş.",
           "Marmara Ofis Malzemeleri A.Ş.", "Toros Makina Sanayi A.Ş."),
    "FR": ("Dupont Fournitures SARL", "Transports Lefèvre SA", "Atelier Girard SAS", "Bureautique Moreau SARL",
           "Logiciels Rousseau SAS"),
    "NL": ("Van Dijk Kantoorartikelen B.V.", "De Vries Transport B.V.", "Jansen Techniek B.V.",
           "Bakker Software N.V.", "Visser & Zonen B.V."),
    "ES": ("Suministros García S.L.", "Transportes Martínez S.A.", "Ingeniería López S.L.",
           "Papelería Fernández S.L.", "Software Navarro S.A."),
    "IT": ("Rossi Forniture S.r.l.", "Trasporti Bianchi S.p.A.", "Ferrari Meccanica S.r.l.",
           "Cartoleria Esposito S.r.l.", "Software Romano S.p.A."),
}
_ADDRESSES = {
    "GB": (("12 King Street", "London EC2V 8AA"), ("3 Quay Road", "Bristol BS1 6QA"),
           ("40 Station Approach", "Leeds LS1 4DY")),
    "US": (("350 Fifth Avenue", "New York, NY 10118"), ("1200 Main Street", "Springfield, IL 62701"),
           ("77 Harbor Drive", "San Diego, CA 92101")),
    "DE": (("Hauptstraße 5", "10115 Berlin"), ("Am Hafen 7", "20457 Hamburg"), ("Königsallee 60", "40212 Düsseldorf")),
    "TR": (("Atatürk Cad. No:12", "34394 Şişli / İstanbul"), ("İnönü Bulvarı No:48", "06510 Çankaya / Ankara"),
           ("Cumhuriyet Mah. 1203. Sok. No:5", "35210 Konak / İzmir")),
    "FR": (("12 rue de la Paix", "75002 Paris"), ("5 avenue Jean Jaurès", "69007 Lyon"),
           ("18 quai des Chartrons", "33000 Bordeaux")),
    "NL": (("Keizersgracht 120", "1015 CW Amsterdam"), ("Coolsingel 40", "3011 AD Rotterdam"),
           ("Stationsplein 8", "3511 ED Utrecht")),
    "ES": (("Calle Mayor 14", "28013 Madrid"), ("Avinguda Diagonal 210", "08018 Barcelona"),
           ("Calle Colón 3", "46004 Valencia")),
    "IT": (("Via Roma 21", "20121 Milano"), ("Corso Vittorio Emanuele 8", "10121 Torino"),
           ("Via del Corso 150", "00186 Roma")),
}
_IBAN_BBAN = {  # (length of the BBAN, leading letters)
    "GB": (18, 4), "DE": (18, 0), "TR": (22, 0), "FR": (23, 0), "NL": (14, 4), "ES": (20, 0), "IT": (23, 1),
}
_BANK_LETTERS = {"GB": ("NWBK", "BARC", "LOYD"), "NL": ("ABNA", "INGB", "RABO"), "IT": ("X", "Y", "Z")}

_WORDS: dict[str, dict[str, tuple[str, ...]]] = {
    "en": {
        "title": ("INVOICE", "Invoice", "TAX INVOICE"), "credit": ("CREDIT NOTE", "Credit Note"),
        "number": ("Invoice No", "Invoice Number", "Invoice #"), "credit_number": ("Credit Note No",),
        "issue": ("Invoice Date", "Date of issue"), "due": ("Due Date", "Payment Due"),
        "delivery": ("Delivery Date",), "order": ("Order No", "PO Number"), "currency": ("Currency",),
        "supplier": ("Supplier", "From", "Seller"), "buyer": ("Bill to", "Invoice to", "Customer", "Sold to"),
        "vat": ("VAT No", "VAT Reg. No"), "debit": ("Direct debit from",),
        "subtotal": ("Subtotal", "Net amount"), "tax": ("VAT",), "tax_total": ("Total VAT",),
        "total": ("Total", "Amount due"), "bank": ("Bank details",), "page": ("Page {n} of {m}",),
        "carried": ("Carried forward",), "brought": ("Brought forward",),
        "head": ("Description", "Qty", "Unit price", "Rate", "Amount"),
        "notes": ("Thank you for your business.", "Please quote our reference with your payment.",
                  "Goods remain our property until paid in full."),
    },
    "de": {
        "title": ("RECHNUNG", "Rechnung"), "credit": ("GUTSCHRIFT", "Gutschrift"),
        "number": ("Rechnungsnummer", "Rechnung Nr."), "credit_number": ("Gutschrift Nr.",),
        "issue": ("Rechnungsdatum",), "due": ("Fällig am", "Zahlbar bis"),
        "delivery": ("Lieferdatum", "Leistungsdatum"), "order": ("Bestellnummer", "Ihre Bestellung"),
        "currency": ("Währung",), "supplier": ("Lieferant", "Verkäufer", "Rechnungssteller"),
        "buyer": ("Rechnung an", "Rechnungsempfänger", "Kunde"), "vat": ("USt-IdNr.", "USt-ID"),
        "debit": ("Lastschrift von",), "subtotal": ("Zwischensumme", "Nettobetrag"), "tax": ("MwSt.", "USt."),
        "tax_total": ("Summe MwSt.",), "total": ("Gesamtbetrag", "Rechnungsbetrag"),
        "bank": ("Bankverbindung",), "page": ("Seite {n} von {m}",), "carried": ("Übertrag",),
        "brought": ("Übertrag",), "head": ("Bezeichnung", "Menge", "Einzelpreis", "Satz", "Betrag"),
        "notes": ("Vielen Dank für Ihren Auftrag.", "Bitte geben Sie bei Zahlung die Rechnungsnummer an."),
    },
    "tr": {
        "title": ("FATURA", "e-Arşiv Fatura"), "credit": ("İADE FATURASI",),
        "number": ("Fatura No", "Belge No"), "credit_number": ("İade Fatura No",),
        "issue": ("Fatura Tarihi", "Düzenleme Tarihi"), "due": ("Vade Tarihi", "Son Ödeme Tarihi"),
        "delivery": ("İrsaliye Tarihi",), "order": ("Sipariş No",), "currency": ("Para Birimi",),
        "supplier": ("Satıcı", "Düzenleyen"), "buyer": ("Alıcı", "Sayın", "Müşteri"),
        "vat": ("VKN", "Vergi No"), "debit": ("Otomatik ödeme hesabı",),
        "subtotal": ("Ara Toplam", "Mal Hizmet Toplam Tutarı"), "tax": ("KDV",), "tax_total": ("Toplam KDV",),
        "total": ("Genel Toplam", "Ödenecek Tutar"), "bank": ("Banka Bilgileri",), "page": ("Sayfa {n}/{m}",),
        "carried": ("Nakli yekün",), "brought": ("Nakli yekün",),
        "head": ("Mal Hizmet", "Miktar", "Birim Fiyat", "KDV Oranı", "Tutar"),
        "notes": ("Bu fatura elektronik ortamda düzenlenmiştir.", "Bizi tercih ettiğiniz için teşekkür ederiz."),
    },
    "fr": {
        "title": ("FACTURE", "Facture"), "credit": ("AVOIR", "Facture d'avoir"),
        "number": ("Facture n°", "N° de facture"), "credit_number": ("Avoir n°",),
        "issue": ("Date de facture", "Date d'émission"), "due": ("Date d'échéance", "Échéance"),
        "delivery": ("Date de livraison",), "order": ("N° de commande", "Bon de commande"),
        "currency": ("Devise",), "supplier": ("Fournisseur", "Vendeur", "Émetteur"),
        "buyer": ("Facturé à", "Client", "Destinataire"), "vat": ("N° TVA", "TVA intracom."),
        "debit": ("Prélèvement sur",), "subtotal": ("Total HT", "Sous-total"), "tax": ("TVA",),
        "tax_total": ("Total TVA",), "total": ("Total TTC", "Net à payer"), "bank": ("Coordonnées bancaires",),
        "page": ("Page {n}/{m}",), "carried": ("À reporter",), "brought": ("Report",),
        "head": ("Désignation", "Qté", "Prix unitaire", "TVA", "Montant HT"),
        "notes": ("Merci de votre confiance.", "Pas d'escompte pour paiement anticipé."),
    },
    "nl": {
        "title": ("FACTUUR", "Factuur"), "credit": ("CREDITNOTA", "Creditfactuur"),
        "number": ("Factuurnummer", "Factuurnr."), "credit_number": ("Creditnota nr.",),
        "issue": ("Factuurdatum",), "due": ("Vervaldatum", "Te betalen voor"),
        "delivery": ("Leverdatum",), "order": ("Ordernummer", "Uw referentie"), "currency": ("Valuta",),
        "supplier": ("Leverancier", "Verkoper"), "buyer": ("Factuur aan", "Klant", "Afnemer"),
        "vat": ("Btw-nummer", "BTW-nr."), "debit": ("Incasso van",), "subtotal": ("Subtotaal", "Totaal excl. btw"),
        "tax": ("Btw",), "tax_total": ("Totaal btw",), "total": ("Totaal incl. btw", "Te betalen"),
        "bank": ("Bankgegevens",), "page": ("Pagina {n} van {m}",), "carried": ("Transport",),
        "brought": ("Transport",), "head": ("Omschrijving", "Aantal", "Prijs", "Btw", "Bedrag"),
        "notes": ("Bedankt voor uw bestelling.", "Vermeld bij betaling altijd het factuurnummer."),
    },
    "es": {
        "title": ("FACTURA", "Factura"), "credit": ("FACTURA RECTIFICATIVA", "Nota de crédito"),
        "number": ("Nº de factura", "Factura nº"), "credit_number": ("Rectificativa nº",),
        "issue": ("Fecha de factura", "Fecha de emisión"), "due": ("Fecha de vencimiento", "Vencimiento"),
        "delivery": ("Fecha de entrega",), "order": ("Nº de pedido", "Su pedido"), "currency": ("Moneda",),
        "supplier": ("Proveedor", "Vendedor", "Emisor"), "buyer": ("Facturar a", "Cliente", "Destinatario"),
        "vat": ("NIF", "NIF-IVA"), "debit": ("Domiciliación en",), "subtotal": ("Base imponible", "Subtotal"),
        "tax": ("IVA",), "tax_total": ("Total IVA", "Cuota IVA"), "total": ("Total factura", "Total a pagar"),
        "bank": ("Datos bancarios",), "page": ("Página {n} de {m}",), "carried": ("Suma y sigue",),
        "brought": ("Suma anterior",), "head": ("Concepto", "Cant.", "Precio", "IVA", "Importe"),
        "notes": ("Gracias por su confianza.", "Indique el número de factura en su pago."),
    },
    "it": {
        "title": ("FATTURA", "Fattura"), "credit": ("NOTA DI CREDITO", "Nota di credito"),
        "number": ("Fattura n.", "Numero fattura"), "credit_number": ("Nota di credito n.",),
        "issue": ("Data fattura", "Data documento"), "due": ("Scadenza", "Data scadenza"),
        "delivery": ("Data consegna",), "order": ("N. ordine", "Vs. ordine"), "currency": ("Valuta",),
        "supplier": ("Fornitore", "Cedente", "Venditore"), "buyer": ("Fatturare a", "Cliente", "Cessionario"),
        "vat": ("P.IVA", "Partita IVA"), "debit": ("Addebito su",), "subtotal": ("Imponibile", "Totale imponibile"),
        "tax": ("IVA",), "tax_total": ("Totale IVA",), "total": ("Totale fattura", "Totale documento"),
        "bank": ("Coordinate bancarie",), "page": ("Pagina {n} di {m}",), "carried": ("A riportare",),
        "brought": ("Riporto",), "head": ("Descrizione", "Q.tà", "Prezzo", "IVA", "Importo"),
        "notes": ("Grazie per la fiducia.", "Indicare il numero di fattura nel pagamento."),
    },
}

_MONTHS = {
    "en": ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"),
    "de": ("Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September", "Oktober",
           "November", "Dezember"),
    "tr": ("Ocak", "Şubat", "Mart", "Nisan", "Mayıs", "Haziran", "Temmuz", "Ağustos", "Eylül", "Ekim", "Kasım",
           "Aralık"),
    "fr": ("janvier", "février", "mars", "avril", "mai", "juin", "juillet", "août", "septembre", "octobre",
           "novembre", "décembre"),
    "nl": ("januari", "februari", "maart", "april", "mei", "juni", "juli", "augustus", "september", "oktober",
           "november", "december"),
    "es": ("enero", "febrero", "marzo", "abril", "mayo", "junio", "julio", "agosto", "septiembre", "octubre",
           "noviembre", "diciembre"),
    "it": ("gennaio", "febbraio", "marzo", "aprile", "maggio", "giugno", "luglio", "agosto", "settembre",
           "ottobre", "novembre", "dicembre"),
}

_CATALOG = {  # (low price, high price, description per language)
    "en": ("Office chair, ergonomic", "Printer paper A4, box of 5 reams", "Consulting services, ERP workshop",
           "Laptop docking station USB-C", "Annual software maintenance", "Freight charges, full truck load",
           "On-site installation", "27 inch monitor", "Packaging material, stretch film", "Ethernet cable Cat6"),
    "de": ("Bürostuhl ergonomisch", "Kopierpapier A4, 5 Pakete", "Beratungsleistung ERP-Workshop",
           "Dockingstation USB-C", "Softwarewartung jährlich", "Frachtkosten Komplettladung",
           "Montage vor Ort", "Monitor 27 Zoll", "Verpackungsmaterial Stretchfolie", "Netzwerkkabel Cat6"),
    "tr": ("Ofis sandalyesi, ergonomik", "A4 fotokopi kağıdı, 5'li koli", "Danışmanlık hizmeti, ERP çalıştayı",
           "Laptop yerleştirme istasyonu", "Yıllık yazılım bakım hizmeti", "Nakliye bedeli, komple tır",
           "Yerinde kurulum", "27 inç monitör", "Ambalaj malzemesi, streç film", "Ethernet kablosu Cat6"),
    "fr": ("Fauteuil de bureau ergonomique", "Papier A4, carton de 5 ramettes", "Prestation de conseil ERP",
           "Station d'accueil USB-C", "Maintenance logicielle annuelle", "Frais de transport, camion complet",
           "Installation sur site", "Écran 27 pouces", "Film étirable d'emballage", "Câble réseau Cat6"),
    "nl": ("Bureaustoel ergonomisch", "Printpapier A4, doos van 5 pakken", "Advieswerkzaamheden ERP",
           "Dockingstation USB-C", "Jaarlijks softwareonderhoud", "Vrachtkosten, volle vrachtwagen",
           "Installatie op locatie", "Monitor 27 inch", "Verpakkingsmateriaal, rekfolie", "Netwerkkabel Cat6"),
    "es": ("Silla de oficina ergonómica", "Papel A4, caja de 5 paquetes", "Servicios de consultoría ERP",
           "Base de conexión USB-C", "Mantenimiento anual de software", "Portes, camión completo",
           "Instalación in situ", "Monitor de 27 pulgadas", "Film estirable de embalaje", "Cable de red Cat6"),
    "it": ("Sedia da ufficio ergonomica", "Carta A4, scatola da 5 risme", "Consulenza ERP",
           "Docking station USB-C", "Manutenzione software annuale", "Spese di trasporto, carico completo",
           "Installazione in loco", "Monitor 27 pollici", "Film estensibile per imballaggio", "Cavo di rete Cat6"),
}
_PRICES = ((80, 900), (3, 40), (60, 250), (90, 400), (500, 12000), (300, 4500), (70, 180), (150, 2500),
           (1, 8), (5, 60))


def _spec(rng: random.Random, *, language: str, layout: str) -> _Spec:
    if language == "en":
        country = rng.choice(("GB", "GB", "US", "US", "DE", "NL", "TR"))
    else:
        country = _COUNTRY_OF[language]
    if country == "US":
        buyer_country = "US"
    else:
        buyer_country = country if rng.random() < 0.75 else rng.choice(("DE", "FR", "NL", "ES", "IT", "GB"))
    supplier = _party(rng, country=country, supplier=True)
    buyer = _party(rng, country=buyer_country, supplier=False, not_named=supplier.name)
    if buyer.address == supplier.address:
        buyer = dataclasses.replace(buyer, address=_ADDRESSES[buyer_country][
            (_ADDRESSES[buyer_country].index(buyer.address) + 1) % len(_ADDRESSES[buyer_country])])
    credit = rng.random() < 0.15
    issue = dt.date(2025, 1, 1) + dt.timedelta(days=rng.randrange(730))
    if rng.random() < 0.5:  # a day that can pass for a month: the day-for-month reading is a valid date
        issue = issue.replace(day=rng.randint(1, 12))
    due = issue + dt.timedelta(days=rng.choice((7, 14, 30, 30, 45, 60))) if rng.random() < 0.75 else None
    if due is not None and rng.random() < 0.4:
        due = due.replace(day=rng.randint(1, 12))
        if due <= issue:
            due = None
    delivery = issue - dt.timedelta(days=rng.randint(1, 6)) if rng.random() < 0.4 else None
    date_form = rng.choice(_DATE_FORMS[country])
    if not _locale_signal(language=language, supplier=supplier) and date_form in _NUMERIC_FORMS:
        due, delivery = _one_reading_or_none(rng, issue=issue, due=due, delivery=delivery)

    currency = rng.choice(_CURRENCIES[country])
    shown = rng.choice(("code_after", "code_before", "symbol", "symbol", "field"))
    if rng.random() < 0.07:
        shown = "none"
    if shown == "symbol" and not _SYMBOLS[currency]:
        shown = "code_after"
    mark = {"none": "", "symbol": rng.choice(_SYMBOLS[currency]) if _SYMBOLS[currency] else ""}.get(shown, currency)

    several = rng.random() < 0.35
    rates = _RATES[country]
    count = rng.randint(4, 9) if layout == "multi-page" else rng.choice((1, 2, 2, 3, 3, 4, 5, 6))
    main_rate = decimal.Decimal(rates[0])
    lines = []
    for _ in range(count):
        rate = decimal.Decimal(rng.choice(rates[1:])) if several and rng.random() < 0.4 else main_rate
        lines.append(_line(rng, language=language, rate=rate, credit=credit))
    if several and len({line.rate for line in lines}) == 1 and len(lines) > 1:
        lines[-1] = dataclasses.replace(lines[-1], rate=decimal.Decimal(rates[-1]))
    subtotal = sum((line.amount for line in lines), decimal.Decimal(0))
    taxes = []
    for rate in sorted({line.rate for line in lines}, reverse=True):
        base = sum((line.amount for line in lines if line.rate == rate), decimal.Decimal(0))
        taxes.append((rate, _round(base * rate / _HUNDRED)))
    tax_total = sum((tax for _, tax in taxes), decimal.Decimal(0))
    return _Spec(
        language=language, layout=layout, credit=credit, supplier=supplier, buyer=buyer,
        number=_number(rng, country=country, year=issue.year, credit=credit),
        order_no=rng.choice(("PO", "SO", "B", "C")) + "-" + str(rng.randint(10000, 99999)) if rng.random() < 0.5
        else None,
        issue=issue, due=due, delivery=delivery, date_form=date_form, currency=currency, currency_shown=shown,
        mark=mark, grouped=rng.random() < 0.6, lines=tuple(lines), subtotal=subtotal, taxes=tuple(taxes),
        tax_total=tax_total, total=subtotal + tax_total, rate_column=len(taxes) > 1 or rng.random() < 0.6,
        noise=rng.random() < 0.5, bank_in_party=rng.random() < 0.4,
    )


def _one_reading_or_none(
        rng: random.Random,
        *,
        issue: dt.date,
        due: dt.date | None,
        delivery: dt.date | None,
) -> tuple[dt.date | None, dt.date | None]:
    """
    Due and delivery dates for a document with no locale signal: either every printed date
    has a day past 12 (the form reads one way) or none has (every date reads two ways), so a
    policy cannot settle the form from one date and apply it to another.
    """
    days = range(13, 29) if issue.day > 12 else range(1, 13)
    if due is not None:
        due = due.replace(day=rng.choice(days))
        due = due if due > issue else None
    if delivery is not None:
        delivery = delivery.replace(day=rng.choice(days))
        delivery = delivery if delivery < issue else None
    return due, delivery


def _party(rng: random.Random, *, country: str, supplier: bool, not_named: str = "") -> _Party:
    name = rng.choice([name for name in _COMPANIES[country] if name != not_named])
    vat_id: str | None = None
    vat_printed: str | None = None
    if country != "US" and (supplier or rng.random() < 0.85):
        vat_id = _vat_id(rng, country=country)
        vat_printed = vat_id
        if country == "GB" and rng.random() < 0.4:
            vat_printed = f"{vat_id[:2]} {vat_id[2:5]} {vat_id[5:9]} {vat_id[9:]}"
        elif country == "FR" and rng.random() < 0.4:
            vat_printed = f"{vat_id[:4]} {vat_id[4:]}"
    iban: str | None = None
    if country != "US" and (rng.random() < 0.9 if supplier else rng.random() < 0.3):
        iban = _iban(rng, country=country)
    return _Party(name=name, country=country, vat_id=vat_id, vat_printed=vat_printed,
                  address=rng.choice(_ADDRESSES[country]), iban=iban)


def _vat_id(rng: random.Random, *, country: str) -> str:
    digits = "".join(str(rng.randint(0, 9)) for _ in range(12))
    first = str(rng.randint(1, 9))
    if country == "TR":
        return first + digits[:9]
    if country in ("DE", "GB"):
        return country + first + digits[:8]
    if country == "FR":
        return "FR" + digits[:2] + first + digits[2:10]
    if country == "NL":
        return "NL" + first + digits[:8] + "B" + digits[8:10]
    if country == "ES":
        return "ES" + rng.choice("ABG") + digits[:8]
    return "IT" + first + digits[:10]


def _iban(rng: random.Random, *, country: str) -> str:
    length, letters = _IBAN_BBAN[country]
    lead = rng.choice(_BANK_LETTERS[country]) if letters else ""
    bban = lead + "".join(str(rng.randint(0, 9)) for _ in range(length - letters))
    return country + iban_check_digits(country=country, bban=bban) + bban


def iban_check_digits(*, country: str, bban: str) -> str:
    """ISO 13616 check digits: 98 - (BBAN + country + "00", letters as 10..35) mod 97."""
    digits = "".join(str(int(char, 36)) for char in (bban + country + "00").upper())
    return f"{98 - int(digits) % 97:02d}"


def _number(rng: random.Random, *, country: str, year: int, credit: bool) -> str:
    serial = rng.randint(1, 99999)
    prefix = {"GB": "INV", "US": "INV", "DE": "RE", "TR": "FTR", "FR": "FA", "NL": "F", "ES": "FV", "IT": "FT"}
    if credit:
        return f"{'CN' if country in ('GB', 'US') else 'GS' if country == 'DE' else 'AV'}-{year}-{serial:05d}"
    return rng.choice((f"{prefix[country]}-{year}-{serial:05d}", f"{prefix[country]}{year % 100}/{serial:05d}"))


def _line(rng: random.Random, *, language: str, rate: decimal.Decimal, credit: bool) -> _Line:
    index = rng.randrange(len(_PRICES))
    low, high = _PRICES[index]
    quantity = decimal.Decimal(rng.choice((1, 1, 2, 3, 4, 5, 10, 12, 24, 50, 100)))
    if rng.random() < 0.15:
        quantity = decimal.Decimal(rng.randint(1, 40)) / 2
    unit_price = decimal.Decimal(rng.randint(low * 100, high * 100)) / 100
    if credit:
        unit_price = -unit_price
    return _Line(description=_CATALOG[language][index], quantity=quantity.normalize(), unit_price=unit_price,
                 amount=_round(quantity * unit_price), rate=rate)


def _round(value: decimal.Decimal) -> decimal.Decimal:
    return value.quantize(_CENT, rounding=decimal.ROUND_HALF_UP)


def _plain(value: decimal.Decimal) -> str:
    return format(value.normalize(), "f")


# ---------------------------------------------------------------------------------------------
# printing values
# ---------------------------------------------------------------------------------------------

def _money(spec: _Spec, value: decimal.Decimal, *, mark: bool = False) -> str:
    sign = "-" if value < 0 else ""
    whole, cents = f"{abs(value):.2f}".split(".")
    thousands = {"en": ",", "fr": " "}.get(spec.language, ".")
    point = "." if spec.language == "en" else ","
    if spec.grouped:
        groups: list[str] = []
        while len(whole) > 3:
            groups.insert(0, whole[-3:])
            whole = whole[:-3]
        whole = thousands.join([whole, *groups])
    text = f"{sign}{whole}{point}{cents}"
    if not mark or spec.currency_shown in ("none", "field"):
        return text
    if spec.currency_shown == "code_before" and not sign:
        return f"{spec.mark} {text}"
    if spec.currency_shown == "symbol" and spec.mark in ("£", "€") and spec.language == "en" and not sign:
        return f"{spec.mark}{text}"
    return f"{text} {spec.mark}"


def _quantity(spec: _Spec, value: decimal.Decimal) -> str:
    text = _plain(value)
    return text if spec.language == "en" else text.replace(".", ",")


def _rate(spec: _Spec, rate: decimal.Decimal) -> str:
    text = _plain(rate) if spec.language == "en" else _plain(rate).replace(".", ",")
    if spec.language == "tr":
        return f"%{text}"
    return f"{text} %" if spec.language in ("fr", "de") else f"{text}%"


def _date(spec: _Spec, value: dt.date) -> str:
    form = spec.date_form
    if form == "iso":
        return value.isoformat()
    if form == "dots":
        return f"{value.day:02d}.{value.month:02d}.{value.year}"
    if form == "slash_dmy":
        return f"{value.day:02d}/{value.month:02d}/{value.year}"
    if form == "slash_mdy":
        return f"{value.month:02d}/{value.day:02d}/{value.year}"
    if form == "dash_dmy":
        return f"{value.day:02d}-{value.month:02d}-{value.year}"
    month = _MONTHS[spec.language][value.month - 1]
    if form == "long_us":
        return f"{month} {value.day}, {value.year}"
    if spec.language == "de":
        return f"{value.day}. {month} {value.year}"
    if spec.language == "es":
        return f"{value.day} de {month} de {value.year}"
    return f"{value.day} {month} {value.year}"


def _iban_text(iban: str) -> str:
    return " ".join(iban[index:index + 4] for index in range(0, len(iban), 4))


def _word(spec: _Spec, role: str, rng: random.Random) -> str:
    return rng.choice(_WORDS[spec.language][role])


def _noisy(spec: _Spec, text: str, rng: random.Random) -> str:
    """At most one OCR slip in free text (never in a value): doubled space, O/0 or l/I swap, stray mark."""
    if not spec.noise:
        return text
    roll = rng.random()
    if roll < 0.3 and " " in text:
        index = rng.choice([i for i, char in enumerate(text) if char == " "])
        return text[:index] + " " + text[index:]
    if roll < 0.6:
        for old, new in (("o", "0"), ("l", "I"), ("e", "c")):
            spots = [i for i, char in enumerate(text) if char == old and text[i - 1:i].isalpha()]
            if spots:
                index = rng.choice(spots)
                return text[:index] + new + text[index + 1:]
    if roll < 0.8:
        return text + rng.choice((" .", " ,", "'", " ·"))
    return text


# ---------------------------------------------------------------------------------------------
# blocks
# ---------------------------------------------------------------------------------------------

def _header(spec: _Spec, rng: random.Random) -> list[tuple[str, str]]:
    number_label = _word(spec, "credit_number" if spec.credit else "number", rng)
    fields = [(number_label, spec.number), (_word(spec, "issue", rng), _date(spec, spec.issue))]
    if spec.due is not None:
        fields.append((_word(spec, "due", rng), _date(spec, spec.due)))
    extras = []
    if spec.delivery is not None:
        extras.append((_word(spec, "delivery", rng), _date(spec, spec.delivery)))
    if spec.order_no is not None:
        extras.append((_word(spec, "order", rng), spec.order_no))
    if spec.currency_shown == "field":
        extras.append((_word(spec, "currency", rng), spec.currency))
    rng.shuffle(extras)
    return fields + extras


def _party_body(spec: _Spec, party: _Party, rng: random.Random, *, supplier: bool) -> list[str]:
    lines = [party.name, *(_noisy(spec, line, rng) for line in party.address)]
    if party.vat_printed is not None:
        lines.append(f"{_word(spec, 'vat', rng)}: {party.vat_printed}")
    if party.iban is not None and (not supplier or spec.bank_in_party):
        prefix = "" if supplier else f"{_word(spec, 'debit', rng)} "
        lines.append(f"{prefix}IBAN: {_iban_text(party.iban)}")
    return lines


def _buyer_block(spec: _Spec, rng: random.Random) -> list[str]:
    label = _word(spec, "buyer", rng)
    body = _party_body(spec, spec.buyer, rng, supplier=False)
    if label == "Sayın":
        return [label, *body]
    if rng.random() < 0.3:
        return [f"{label}: {body[0]}", *body[1:]]
    return [f"{label}:", *body]


def _bank(spec: _Spec, rng: random.Random) -> list[str]:
    if spec.supplier.iban is None or spec.bank_in_party:
        return []
    return [f"{_word(spec, 'bank', rng)}: IBAN {_iban_text(spec.supplier.iban)}"]


def _table(spec: _Spec, lines: Sequence[_Line], rng: random.Random, *, first: int = 1) -> list[str]:
    description, qty, price, rate, amount = _WORDS[spec.language]["head"]
    headers = ["#", description, qty, price, *([rate] if spec.rate_column else []), amount]
    rows = []
    for number, line in enumerate(lines, start=first):
        rows.append([str(number), line.description, _quantity(spec, line.quantity), _money(spec, line.unit_price),
                     *([_rate(spec, line.rate)] if spec.rate_column else []), _money(spec, line.amount)])
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    gap = " " * rng.randint(2, 4)

    def printed(cells: Sequence[str]) -> str:
        return gap.join(cell.ljust(width) if i < 2 else cell.rjust(width)
                        for i, (cell, width) in enumerate(zip(cells, widths, strict=True)))

    header = printed(headers)
    return [header, "-" * len(header), *(printed(row) for row in rows)]


def _totals(spec: _Spec, rng: random.Random) -> list[str]:
    rows = [(_word(spec, "subtotal", rng), _money(spec, spec.subtotal, mark=True))]
    tax = _word(spec, "tax", rng)
    for rate, amount in spec.taxes:
        rows.append((f"{tax} {_rate(spec, rate)}", _money(spec, amount, mark=True)))
    if len(spec.taxes) > 1 or rng.random() < 0.3:
        rows.append((_word(spec, "tax_total", rng), _money(spec, spec.tax_total, mark=True)))
    rows.append((_word(spec, "total", rng), _money(spec, spec.total, mark=True)))
    width = max(len(label) for label, _ in rows) + 3
    amount_width = max(len(amount) for _, amount in rows)
    indent = " " * rng.randint(0, 24)
    return [indent + f"{label}:".ljust(width) + amount.rjust(amount_width) for label, amount in rows]


def _notes(spec: _Spec, rng: random.Random) -> list[str]:
    return [_noisy(spec, note, rng) for note in rng.sample(_WORDS[spec.language]["notes"], rng.randint(1, 2))]


def _title(spec: _Spec, rng: random.Random) -> str:
    return " " * rng.randint(0, 20) + _word(spec, "credit" if spec.credit else "title", rng)


def _supplier_block(spec: _Spec, rng: random.Random) -> list[str]:
    return [f"{_word(spec, 'supplier', rng)}:", *_party_body(spec, spec.supplier, rng, supplier=True)]


# ---------------------------------------------------------------------------------------------
# layouts
# ---------------------------------------------------------------------------------------------

def _ledger(spec: _Spec, rng: random.Random) -> str:
    header = [f"{label}: {value}" for label, value in _header(spec, rng)]
    parties = [*_supplier_block(spec, rng), "", *_buyer_block(spec, rng)]
    lines = [_title(spec, rng), ""]
    lines += [*header, "", *parties] if rng.random() < 0.5 else [*parties, "", *header]
    lines += ["", *_table(spec, spec.lines, rng), "", *_totals(spec, rng), "", *_notes(spec, rng)]
    lines += ["", *_bank(spec, rng)]
    return _finish(lines)


def _two_column(spec: _Spec, rng: random.Random) -> str:
    lines = [_title(spec, rng), ""]
    fields = [f"{label}: {value}" for label, value in _header(spec, rng)]
    column = max(len(field) for field in fields) + rng.randint(4, 10)
    for index in range(0, len(fields), 2):
        pair = fields[index:index + 2]
        lines.append(pair[0].ljust(column) + pair[1] if len(pair) == 2 else pair[0])
    left = _supplier_block(spec, rng)
    label = _word(spec, "buyer", rng)
    right = [label if label == "Sayın" else f"{label}:", *_party_body(spec, spec.buyer, rng, supplier=False)]
    width = max(len(line) for line in left) + rng.randint(4, 10)
    lines.append("")
    for index in range(max(len(left), len(right))):
        left_cell = left[index] if index < len(left) else ""
        right_cell = right[index] if index < len(right) else ""
        lines.append(left_cell.ljust(width) + right_cell if right_cell else left_cell)
    lines += ["", *_table(spec, spec.lines, rng), "", *_totals(spec, rng), "", *_notes(spec, rng)]
    lines += ["", *_bank(spec, rng)]
    return _finish(lines)


def _letterhead_top(spec: _Spec, rng: random.Random) -> list[str]:
    supplier = spec.supplier
    lines = [supplier.name, _noisy(spec, " · ".join(supplier.address), rng)]
    if supplier.vat_printed is not None:
        lines.append(f"{_word(spec, 'vat', rng)}: {supplier.vat_printed}")
    if supplier.iban is not None and spec.bank_in_party:
        lines.append(f"IBAN: {_iban_text(supplier.iban)}")
    return [*lines, "", "", *_buyer_block(spec, rng), "", _title(spec, rng), ""]


def _header_columns(spec: _Spec, rng: random.Random) -> list[str]:
    label_line, value_line = "", ""
    for label, value in _header(spec, rng):
        width = max(len(label), len(value)) + rng.randint(3, 6)
        label_line += label.ljust(width)
        value_line += value.ljust(width)
    return [label_line, value_line]


def _footer(spec: _Spec, rng: random.Random) -> list[str]:
    bank = _bank(spec, rng)
    return [f"{spec.supplier.name} · {bank[0]}"] if bank else []


def _letterhead(spec: _Spec, rng: random.Random) -> str:
    lines = _letterhead_top(spec, rng)
    lines += [*_header_columns(spec, rng), "", *_table(spec, spec.lines, rng), "", *_totals(spec, rng)]
    lines += ["", *_notes(spec, rng), "", *_footer(spec, rng)]
    return _finish(lines)


def _multi_page(spec: _Spec, rng: random.Random) -> str:
    pages_count = 3 if len(spec.lines) >= 7 else 2
    cuts = sorted(rng.sample(range(1, len(spec.lines)), pages_count - 1))
    chunks = [spec.lines[start:end] for start, end in zip([0, *cuts], [*cuts, len(spec.lines)], strict=True)]
    page_word = _word(spec, "page", rng)
    number_label = _word(spec, "credit_number" if spec.credit else "number", rng)
    footer = _footer(spec, rng)
    pages: list[list[str]] = []
    running = decimal.Decimal(0)
    first = 1
    for index, chunk in enumerate(chunks):
        page: list[str] = []
        if index == 0:
            page += _letterhead_top(spec, rng) + _header_columns(spec, rng) + [""]
        else:
            page += [f"{spec.supplier.name} · {number_label} {spec.number}", ""]
            page += [f"{_word(spec, 'brought', rng)}: {_money(spec, running)}", ""]
        page += _table(spec, chunk, rng, first=first)
        first += len(chunk)
        running += sum((line.amount for line in chunk), decimal.Decimal(0))
        if index < len(chunks) - 1:
            page += ["", f"{_word(spec, 'carried', rng)}: {_money(spec, running)}"]
        else:
            page += ["", *_totals(spec, rng), "", *_notes(spec, rng)]
        page += ["", *footer, page_word.format(n=index + 1, m=len(chunks))]
        pages.append(page)
    return "\f\n".join(_finish(page) for page in pages)


_RENDERERS: dict[str, Callable[[_Spec, random.Random], str]] = {
    "ledger": _ledger, "two-column": _two_column, "letterhead": _letterhead, "multi-page": _multi_page,
}


def _finish(lines: Sequence[str]) -> str:
    return "\n".join(line.rstrip() for line in lines).strip("\n") + "\n"


# ---------------------------------------------------------------------------------------------
# the truth, its doubts, and the corruptions
# ---------------------------------------------------------------------------------------------

def _truth(spec: _Spec) -> dict[str, Any]:
    supplier, buyer = spec.supplier, spec.buyer
    evidence = {"invoice_number": spec.number, "issue_date": _date(spec, spec.issue),
                "supplier.name": supplier.name, "buyer.name": buyer.name}
    if spec.due is not None:
        evidence["due_date"] = _date(spec, spec.due)
    if spec.mark:
        evidence["currency"] = spec.mark
    if supplier.vat_printed is not None:
        evidence["supplier.vat_id"] = supplier.vat_printed
    if supplier.iban is not None:
        evidence["supplier.iban"] = _iban_text(supplier.iban)
    if buyer.vat_printed is not None:
        evidence["buyer.vat_id"] = buyer.vat_printed
    lines = []
    for index, line in enumerate(spec.lines):
        lines.append({"description": line.description, "quantity": _plain(line.quantity),
                      "unit_price": f"{line.unit_price:.2f}", "amount": f"{line.amount:.2f}",
                      "tax_rate": _plain(line.rate)})
        evidence[f"lines[{index}].description"] = line.description
        evidence[f"lines[{index}].quantity"] = _quantity(spec, line.quantity)
        evidence[f"lines[{index}].unit_price"] = _money(spec, line.unit_price)
        evidence[f"lines[{index}].amount"] = _money(spec, line.amount)
        evidence[f"lines[{index}].tax_rate"] = _rate(spec, line.rate)
    evidence["subtotal"] = _money(spec, spec.subtotal)
    evidence["tax_total"] = _money(spec, spec.tax_total)
    evidence["total"] = _money(spec, spec.total)
    return {
        "invoice_number": spec.number,
        "issue_date": spec.issue.isoformat(),
        "due_date": None if spec.due is None else spec.due.isoformat(),
        "currency": spec.currency,
        "supplier": {"name": supplier.name, "vat_id": supplier.vat_id, "iban": supplier.iban},
        "buyer": {"name": buyer.name, "vat_id": buyer.vat_id},
        "lines": lines,
        "subtotal": f"{spec.subtotal:.2f}",
        "tax_total": f"{spec.tax_total:.2f}",
        "total": f"{spec.total:.2f}",
        "evidence": evidence,
    }


def _reads_two_ways(spec: _Spec, value: dt.date) -> bool:
    return spec.date_form in _NUMERIC_FORMS and value.day <= 12 and value.day != value.month


def _doubt(spec: _Spec) -> str | None:
    if spec.currency_shown == "none":
        return CURRENCY_NOT_SHOWN
    dates = [spec.issue, *([spec.due] if spec.due else [])]
    ambiguous = any(_reads_two_ways(spec, value) for value in dates)
    if ambiguous and not _locale_signal(language=spec.language, supplier=spec.supplier):
        return DATE_READS_TWO_WAYS
    return None


def _locale_signal(*, language: str, supplier: _Party) -> bool:
    """
    Whether the document says which way its numeric dates read: the supplier's country from
    its IBAN or a country-prefixed VAT id (a Turkish VKN is bare digits), or a language other
    than English (English is written on both sides of the Atlantic).
    """
    prefixed = supplier.vat_id is not None and supplier.vat_id[:2].isalpha()
    return language != "en" or supplier.iban is not None or prefixed


def _features(spec: _Spec) -> tuple[str, ...]:
    tags = [f"date:{spec.date_form}", f"currency:{spec.currency_shown}", f"country:{spec.supplier.country}"]
    if len(spec.taxes) > 1:
        tags.append("several_rates")
    if spec.grouped and any(abs(value) >= 1000 for value in (spec.subtotal, spec.total)):
        tags.append("grouped")
    if spec.noise:
        tags.append("noise")
    if spec.credit:
        tags.append("credit_note")
    if spec.buyer.iban is not None:
        tags.append("buyer_iban")
    if spec.order_no is not None:
        tags.append("order_no")
    return tuple(tags)


_Changed = tuple[dict[str, Any], tuple[str, ...]]
_Corruption = Callable[[_Spec, str, dict[str, Any], random.Random], "_Changed | None"]

_ALLOWED = ("EUR", "USD", "GBP", "TRY", "CHF")
_ALL_RATES = ("0", "2.1", "3", "4", "5", "5.5", "6", "7", "8", "9", "10", "12", "13", "16", "18", "19", "20",
              "21", "22", "25")


def _currency_absent(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    shown = [code for code in _ALLOWED
             if code in text or any(symbol in text for symbol in _SYMBOLS[code])]
    choices = [code for code in _ALLOWED if code not in shown and code != spec.currency]
    result["currency"] = rng.choice(choices)
    return result, ("currency",)


def _parties_swapped(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    supplier, buyer, evidence = result["supplier"], result["buyer"], result["evidence"]
    supplier["name"], buyer["name"] = buyer["name"], supplier["name"]
    supplier["vat_id"], buyer["vat_id"] = buyer["vat_id"], supplier["vat_id"]
    quotes = {path: evidence.pop(path, None) for path in ("supplier.name", "buyer.name", "supplier.vat_id",
                                                          "buyer.vat_id")}
    for mine, theirs in (("supplier.name", "buyer.name"), ("supplier.vat_id", "buyer.vat_id")):
        for path, quote in ((mine, quotes[theirs]), (theirs, quotes[mine])):
            if quote is not None:
                evidence[path] = quote
    fields = ["supplier.name", "buyer.name"]
    if supplier["vat_id"] != buyer["vat_id"]:
        fields += ["supplier.vat_id", "buyer.vat_id"]
    return result, tuple(fields)


def _buyer_is_supplier(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    result["buyer"] = {"name": spec.supplier.name, "vat_id": spec.supplier.vat_id}
    evidence = result["evidence"]
    evidence["buyer.name"] = evidence["supplier.name"]
    evidence.pop("buyer.vat_id", None)
    if "supplier.vat_id" in evidence:
        evidence["buyer.vat_id"] = evidence["supplier.vat_id"]
    fields = ["buyer.name"] + (["buyer.vat_id"] if spec.buyer.vat_id != spec.supplier.vat_id else [])
    return result, tuple(fields)


def _supplier_name_absent(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    names = [name for names in _COMPANIES.values() for name in names if name not in text]
    result["supplier"]["name"] = rng.choice(names)
    return result, ("supplier.name",)


def _swapped_day_month(value: dt.date) -> dt.date | None:
    if value.day > 12 or value.day == value.month:
        return None
    return value.replace(day=value.month, month=value.day)


def _issue_day_for_month(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    swapped = _swapped_day_month(spec.issue)
    if swapped is None or (spec.due is not None and swapped > spec.due):
        return None
    result["issue_date"] = swapped.isoformat()
    return result, ("issue_date",)


def _due_day_for_month(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    swapped = None if spec.due is None else _swapped_day_month(spec.due)
    if swapped is None or swapped < spec.issue:
        return None
    result["due_date"] = swapped.isoformat()
    return result, ("due_date",)


def _issue_is_delivery(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    if spec.delivery is None:
        return None
    result["issue_date"] = spec.delivery.isoformat()
    result["evidence"]["issue_date"] = _date(spec, spec.delivery)
    return result, ("issue_date",)


def _due_invented(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    if spec.due is not None:
        return None
    result["due_date"] = (spec.issue + dt.timedelta(days=30)).isoformat()
    result["evidence"]["due_date"] = result["evidence"]["issue_date"]
    return result, ("due_date",)


def _rate_printed(rate: str, text: str) -> bool:
    """Whether `rate` appears as a percentage anywhere in `text` (`19%`, `19 %`, `%19`, `5,5 %`)."""
    number = re.escape(rate).replace(r"\.", "[.,]")
    return re.search(rf"(?<![0-9.,]){number}\s?%|%\s?{number}(?![0-9])", text) is not None


def _tax_rate_absent(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    index = rng.randrange(len(spec.lines))
    choices = [rate for rate in _ALL_RATES if not _rate_printed(rate, text)]
    result["lines"][index]["tax_rate"] = rng.choice(choices)
    return result, (f"lines[{index}].tax_rate",)


def _tax_rate_of_other_line(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    if len(spec.taxes) < 2:
        return None
    index = rng.randrange(len(spec.lines))
    other = [rate for rate, _ in spec.taxes if rate != spec.lines[index].rate]
    rate = rng.choice(other)
    result["lines"][index]["tax_rate"] = _plain(rate)
    result["evidence"][f"lines[{index}].tax_rate"] = _rate(spec, rate)
    return result, (f"lines[{index}].tax_rate",)


def _supplier_vat_absent(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    if spec.supplier.vat_id is None:
        return None
    while True:
        fake = _vat_id(rng, country=spec.supplier.country)
        if fake[-6:] not in text:
            break
    result["supplier"]["vat_id"] = fake
    return result, ("supplier.vat_id",)


def _supplier_vat_of_buyer(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    if spec.buyer.vat_id is None or spec.supplier.vat_id is None:
        return None
    result["supplier"]["vat_id"] = spec.buyer.vat_id
    result["evidence"]["supplier.vat_id"] = spec.buyer.vat_printed
    return result, ("supplier.vat_id",)


def _buyer_vat_of_supplier(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    if spec.supplier.vat_id is None:
        return None
    result["buyer"]["vat_id"] = spec.supplier.vat_id
    result["evidence"]["buyer.vat_id"] = spec.supplier.vat_printed
    return result, ("buyer.vat_id",)


def _iban_of_buyer(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    if spec.buyer.iban is None:
        return None
    result["supplier"]["iban"] = spec.buyer.iban
    result["evidence"]["supplier.iban"] = _iban_text(spec.buyer.iban)
    return result, ("supplier.iban",)


def _iban_absent(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    if spec.supplier.iban is None:
        return None
    result["supplier"]["iban"] = _iban(rng, country=spec.supplier.country)
    return result, ("supplier.iban",)


def _number_is_order(spec: _Spec, text: str, result: dict[str, Any], rng: random.Random) -> _Changed | None:
    if spec.order_no is None:
        return None
    result["invoice_number"] = spec.order_no
    result["evidence"]["invoice_number"] = spec.order_no
    return result, ("invoice_number",)


CORRUPTIONS: dict[str, _Corruption] = {
    CURRENCY_ABSENT: _currency_absent,
    PARTIES_SWAPPED: _parties_swapped,
    BUYER_IS_SUPPLIER: _buyer_is_supplier,
    SUPPLIER_NAME_ABSENT: _supplier_name_absent,
    ISSUE_DATE_DAY_FOR_MONTH: _issue_day_for_month,
    DUE_DATE_DAY_FOR_MONTH: _due_day_for_month,
    ISSUE_DATE_IS_DELIVERY_DATE: _issue_is_delivery,
    DUE_DATE_INVENTED: _due_invented,
    TAX_RATE_ABSENT: _tax_rate_absent,
    TAX_RATE_OF_OTHER_LINE: _tax_rate_of_other_line,
    SUPPLIER_VAT_ABSENT: _supplier_vat_absent,
    SUPPLIER_VAT_OF_BUYER: _supplier_vat_of_buyer,
    BUYER_VAT_OF_SUPPLIER: _buyer_vat_of_supplier,
    IBAN_OF_BUYER: _iban_of_buyer,
    IBAN_ABSENT: _iban_absent,
    INVOICE_NUMBER_IS_ORDER_NUMBER: _number_is_order,
}
"""Each single-field corruption: (spec, text, a copy of the truth, rng) -> (answer, changed paths),
or None where it does not apply to the document (no order number to mistake, no buyer IBAN, ...)."""

CLASSES = (CLEAN, *DOUBTFUL, *CORRUPTIONS)
"""Every answer class, in report order."""
