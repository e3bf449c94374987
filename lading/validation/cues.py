"""
The multilingual cue table of `invoice-strict-v2`: the printed words that tell a validator
what a piece of an invoice is for.

A model's answer can fit the schema, add up and quote real text, and still book the buyer as
the supplier, a delivery date as the issue date or an order number as the invoice number. What
tells them apart on paper is the label next to the value: "Bill to", "Rechnung an", "Sayın",
"Facturé à". This module is the one place those labels are listed, for English, German,
Turkish, French, Dutch, Spanish and Italian; `lading.validation.layout` finds them in a
document and `lading.validation.strict_v2` judges with them.

Adding a language is adding words to the tables below (lower case, single spaces; a cue
matches case-insensitively, at the start of a field, as whole words) and a test with an
invoice in that language (tests/unit/validation/test_cues.py). Removing or moving a word
changes what `invoice-strict-v2` accepts: that is a new policy version, not an edit.

    PARTY_CUES        supplier / buyer block headings ("From:", "Bill To:", "Alıcı", "Client :")
    BANK_CUES         payment-details headings: an IBAN there is the payee's, the supplier's
    DEBIT_CUES        direct-debit wording: an IBAN there is the buyer's account
    INVOICE_NUMBER_CUES / OTHER_NUMBER_CUES
                      what labels an invoice number, and the references it must not be
                      confused with (order, customer, delivery note numbers)
    ISSUE_DATE_CUES / DUE_DATE_CUES / OTHER_DATE_CUES
                      the roles of printed dates
    TITLE_CUES        document titles ("INVOICE", "e-Arşiv Fatura"): a block holding only a
                      title is not the letterhead
    LANGUAGE_CUES     words that say which language (and so which date order) a document uses
    MONTHS            month names and their usual abbreviations, per language
    CURRENCY_LABELS   "Currency:" field labels; CURRENCY_SYMBOLS and ISO_CURRENCIES the marks
    TERM_DAYS         "30 days" in each language, for a due date derived from payment terms

Locale facts used to read a date that reads two ways (`03/04/2025`) live here too:
DAY_FIRST_LANGUAGES, MONTH_FIRST_COUNTRIES, and DOLLAR_COUNTRIES (where `$` is not USD).
"""

# ruff: noqa: RUF001, RUF002  (the Turkish dotless i is meant, not a confusable)

from __future__ import annotations

from typing import Final

SUPPLIER: Final = "supplier"
BUYER: Final = "buyer"

PARTY_CUES: Final[dict[str, tuple[str, ...]]] = {
    SUPPLIER: (
        # en
        "supplier", "from", "seller", "vendor", "sold by", "issued by", "bill from", "invoice from", "payee",
        # de
        "lieferant", "verkäufer", "rechnungssteller", "absender", "leistungserbringer", "auftragnehmer",
        # tr
        "satıcı", "düzenleyen", "gönderen", "satıcı bilgileri",
        # fr
        "fournisseur", "vendeur", "émetteur", "emetteur", "prestataire",
        # nl
        "leverancier", "verkoper", "afzender",
        # es
        "proveedor", "vendedor", "emisor",
        # it
        "fornitore", "venditore", "cedente", "cedente/prestatore", "mittente",
        # colon-only forms (`De :`, `Van:`, `Da:`)
        "de", "van", "da",
    ),
    BUYER: (
        # en
        "bill to", "billed to", "invoice to", "invoiced to", "sold to", "customer", "buyer", "client", "to",
        "purchaser",
        # de
        "rechnungsempfänger", "rechnung an", "kunde", "käufer", "an", "empfänger", "auftraggeber",
        # tr
        "alıcı", "sayın", "müşteri", "alıcı bilgileri",
        # fr
        "facturé à", "facture à", "acheteur", "destinataire", "adressé à",
        # nl
        "factuur aan", "klant", "koper", "afnemer", "aan", "gefactureerd aan",
        # es
        "facturar a", "facturado a", "cliente", "comprador", "destinatario",
        # it
        "fatturare a", "fatturato a", "acquirente", "committente", "cessionario",
        "cessionario/committente", "spett.le", "spettabile",
    ),
}
"""Block headings that name the role of the party printed under them (or after them on the same
line, or below them in a side-by-side column). `to`, `an`, `aan` count only followed by a colon."""

COLON_ONLY_CUES: Final = frozenset({"to", "an", "aan", "from", "de", "da", "van", "client"})
"""Short or common words that are a cue only when a colon follows (`An:`), never as a bare word."""

INLINE_CUES: Final = frozenset({"sayın", "spett.le", "spettabile"})
"""Salutations printed right before the name on the same line (`Sayın Ege Tekstil A.Ş.`)."""

BANK_CUES: Final = (
    "bank details", "payment details", "bank account", "remit to", "please pay to", "pay to",
    "bankverbindung", "zahlungsinformationen", "bankdaten", "kontoverbindung",
    "banka bilgileri", "ödeme bilgileri", "hesap bilgileri",
    "coordonnées bancaires", "rib", "paiement",
    "bankgegevens", "betaalgegevens",
    "datos bancarios", "datos de pago",
    "coordinate bancarie", "dati bancari", "modalità di pagamento",
)
"""Payment-details headings: an IBAN under one is where the buyer pays, the supplier's account."""

DEBIT_CUES: Final = (
    "direct debit", "will be debited", "debited from", "your account", "mandate",
    "lastschrift", "abgebucht", "ihrem konto", "ihr konto",
    "otomatik ödeme talimatı", "hesabınızdan",
    "prélèvement", "votre compte",
    "incasso", "uw rekening", "domiciliëring",
    "adeudo", "domiciliación", "su cuenta",
    "addebito", "rid", "sdd", "vostro conto",
)
"""Wording of a direct debit: an IBAN on such a line is the buyer's account, never the payee's."""

INVOICE_NUMBER_CUES: Final = (
    "invoice no", "invoice number", "invoice #", "invoice nr", "invoice", "inv no", "inv #", "tax invoice",
    "document no", "bill no",
    "rechnungsnummer", "rechnung nr", "rechnungs-nr", "rechnungsnr", "rechnung", "re-nr", "beleg-nr",
    "fatura no", "fatura numarası", "belge no", "fatura", "e-arşiv fatura", "e-fatura", "seri sıra no",
    "facture n°", "facture no", "n° de facture", "numéro de facture", "facture", "no facture",
    "factuurnummer", "factuur nr", "factuurnr", "factuur",
    "número de factura", "factura n°", "factura nº", "factura no", "nº factura", "factura", "n.º factura",
    "fattura n", "fattura n°", "numero fattura", "n. fattura", "fattura", "numero documento",
    # credit notes are invoices with negative totals: their number is booked the same way
    "credit note", "credit note no", "credit memo", "gutschrift", "gutschriftsnummer", "gutschrift nr",
    "iade faturası", "iade fatura no", "avoir", "avoir n°", "facture d'avoir", "creditnota", "creditfactuur",
    "factura rectificativa", "nota de crédito", "abono", "nota di credito", "nota credito",
    # word stems, for labels built around them (`Nº de factura`, `Rectificativa nº`, `N. fattura`)
    "factu", "fattur", "rectificativa",
)
"""Labels of the invoice number. A number's label is read by the earliest of these or of
OTHER_NUMBER_CUES that occurs in it (`Nº de pedido` is an order number, `Rechnung Nr.` the
invoice number; on a tie the longer cue)."""

OTHER_NUMBER_CUES: Final = (
    "order no", "order number", "po number", "po no", "purchase order", "customer no", "customer number",
    "account no", "delivery note", "contract no", "reference", "your ref", "our ref",
    "bestellnummer", "bestell-nr", "kundennummer", "kunden-nr", "lieferschein-nr", "lieferschein",
    "auftragsnummer", "auftrags-nr", "vertragsnummer", "ihre referenz",
    "sipariş no", "irsaliye no", "müşteri no", "müşteri numarası", "sözleşme no",
    "bon de commande", "n° de commande", "numéro client", "n° client", "bon de livraison",
    "bestelnummer", "ordernummer", "klantnummer", "pakbon",
    "número de pedido", "pedido", "número de cliente", "albarán",
    "numero ordine", "ordine n", "codice cliente", "ddt",
)
"""Labels of references that are not the invoice number: a quote under one is the wrong number."""

ISSUE_DATE_CUES: Final = (
    "invoice date", "issue date", "date of issue", "date", "dated", "tax point",
    "rechnungsdatum", "datum", "ausstellungsdatum",
    "fatura tarihi", "düzenleme tarihi", "tarih", "belge tarihi",
    "date de facture", "date de facturation", "date d'émission",
    "factuurdatum", "datum factuur",
    "fecha de factura", "fecha de emisión", "fecha",
    "data fattura", "data di emissione", "data",
)
"""Labels of the issue date."""

DUE_DATE_CUES: Final = (
    "due date", "payment due", "due", "pay by", "payable by", "payment date",
    "fällig am", "zahlbar bis", "fälligkeitsdatum", "fällig", "zahlungsziel",
    "vade tarihi", "son ödeme tarihi", "vade",
    "date d'échéance", "échéance", "à payer avant le",
    "vervaldatum", "uiterste betaaldatum", "te betalen voor",
    "fecha de vencimiento", "vencimiento",
    "data di scadenza", "data scadenza", "scadenza", "fecha vencimiento", "date échéance",
)
"""Labels of the due date."""

OTHER_DATE_CUES: Final = (
    "delivery date", "order date", "service date", "shipping date", "date of supply", "date of delivery",
    "period",
    "lieferdatum", "leistungsdatum", "bestelldatum", "leistungszeitraum",
    "irsaliye tarihi", "sipariş tarihi", "teslim tarihi",
    "date de livraison", "date de commande",
    "leverdatum", "besteldatum", "leveringsdatum",
    "fecha de entrega", "fecha de pedido",
    "data di consegna", "data ordine", "data consegna",
)
"""Labels of dates that are neither the issue nor the due date."""

TITLE_CUES: Final = (
    "invoice", "tax invoice", "commercial invoice", "credit note", "credit memo", "rechnung", "gutschrift",
    "iade faturası", "nota de crédito", "nota di credito",
    "fatura", "e-arşiv fatura", "e-fatura", "facture", "avoir", "factuur", "creditnota", "factura",
    "factura rectificativa", "fattura", "nota di credito",
)
"""Document titles: a block holding only titles is not a letterhead."""

LANGUAGE_CUES: Final[dict[str, tuple[str, ...]]] = {
    "en": ("invoice", "total", "subtotal", "bill to", "due date", "amount due", "quantity", "description"),
    "de": ("rechnung", "gesamtbetrag", "zwischensumme", "menge", "rechnungsdatum", "mwst", "ust", "bezeichnung",
           "nettobetrag", "datum"),
    "tr": ("fatura", "toplam", "tutar", "miktar", "tarih", "kdv", "alıcı", "açıklama", "birim fiyat"),
    "fr": ("facture", "montant", "quantité", "tva", "total ttc", "total ht", "désignation", "date de facture"),
    "nl": ("factuur", "bedrag", "aantal", "btw", "totaal", "omschrijving", "factuurdatum"),
    "es": ("factura", "importe", "cantidad", "iva", "fecha", "descripción", "base imponible"),
    "it": ("fattura", "importo", "quantità", "iva", "totale", "descrizione", "imponibile"),
}
"""Words (whole, case-insensitive) that show a document's language."""

DAY_FIRST_LANGUAGES: Final = frozenset({"de", "tr", "fr", "nl", "es", "it"})
"""Languages whose invoices write numeric dates day first. English is written both ways."""

MONTH_FIRST_COUNTRIES: Final = frozenset({"US", "PH", "FM", "MH", "PW"})
"""Countries that write numeric dates month first; every other country a supplier can have a
VAT id or IBAN in writes them day first (or year first, which is never ambiguous)."""

DOLLAR_COUNTRIES: Final = frozenset({
    "CA", "AU", "NZ", "SG", "HK", "MX", "TW", "BR", "AR", "CL", "CO", "JM", "BS", "BB", "FJ", "LR", "NA",
})
"""Supplier countries where a bare `$` is not (or not only) the US dollar."""

MONTHS: Final[dict[str, tuple[tuple[str, ...], ...]]] = {
    "en": (("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",),
           ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"),
           ("october", "oct"), ("november", "nov"), ("december", "dec")),
    "de": (("januar", "jan", "jänner"), ("februar", "feb"), ("märz", "mär", "maerz"), ("april", "apr"),
           ("mai",), ("juni", "jun"), ("juli", "jul"), ("august", "aug"), ("september", "sep", "sept"),
           ("oktober", "okt"), ("november", "nov"), ("dezember", "dez")),
    "tr": (("ocak", "oca"), ("şubat", "şub", "subat"), ("mart", "mar"), ("nisan", "nis"), ("mayıs", "may"),
           ("haziran", "haz"), ("temmuz", "tem"), ("ağustos", "ağu", "agustos"), ("eylül", "eyl", "eylul"),
           ("ekim", "eki"), ("kasım", "kas", "kasim"), ("aralık", "ara", "aralik")),
    "fr": (("janvier", "janv"), ("février", "févr", "fevrier"), ("mars",), ("avril", "avr"), ("mai",),
           ("juin",), ("juillet", "juil"), ("août", "aout"), ("septembre", "sept"), ("octobre", "oct"),
           ("novembre", "nov"), ("décembre", "déc", "decembre")),
    "nl": (("januari", "jan"), ("februari", "feb"), ("maart", "mrt"), ("april", "apr"), ("mei",),
           ("juni", "jun"), ("juli", "jul"), ("augustus", "aug"), ("september", "sep", "sept"),
           ("oktober", "okt"), ("november", "nov"), ("december", "dec")),
    "es": (("enero", "ene"), ("febrero", "feb"), ("marzo", "mar"), ("abril", "abr"), ("mayo", "may"),
           ("junio", "jun"), ("julio", "jul"), ("agosto", "ago"), ("septiembre", "setiembre", "sep", "sept"),
           ("octubre", "oct"), ("noviembre", "nov"), ("diciembre", "dic")),
    "it": (("gennaio", "gen"), ("febbraio", "feb"), ("marzo", "mar"), ("aprile", "apr"), ("maggio", "mag"),
           ("giugno", "giu"), ("luglio", "lug"), ("agosto", "ago"), ("settembre", "set", "sett"),
           ("ottobre", "ott"), ("novembre", "nov"), ("dicembre", "dic")),
}
"""Month names, then their abbreviations, January first. A name means the same month in every
language that uses it (`mar` is March in all of en, tr, es, it), so a date with a month name
is never ambiguous."""

CURRENCY_LABELS: Final = (
    "currency", "währung", "para birimi", "döviz cinsi", "döviz", "devise", "monnaie", "valuta", "moneda",
    "divisa",
)
"""Labels of a currency field (`Currency: GBP`)."""

CURRENCY_SYMBOLS: Final[dict[str, str]] = {
    "€": "EUR", "£": "GBP", "₺": "TRY", "TL": "TRY", "$": "USD", "US$": "USD", "¥": "JPY", "Fr.": "CHF",
    "SFr.": "CHF", "CHF": "CHF",
}
"""Printed marks and the currency each stands for (`$` only where the supplier's country is not in
DOLLAR_COUNTRIES; `¥` only outside CN)."""

ISO_CURRENCIES: Final = frozenset({
    "TRY", "EUR", "USD", "GBP", "CHF", "JPY", "CNY", "CAD", "AUD", "NZD", "SEK", "NOK", "DKK", "PLN", "CZK",
    "HUF", "RON", "BGN", "RUB", "UAH", "INR", "SGD", "HKD", "MXN", "BRL", "ZAR", "AED", "SAR", "KRW", "ILS",
})
"""ISO 4217 codes recognised as currency marks: every booked currency and the ones a document
is likely to show beside it (an exchange-rate note, a foreign-currency invoice)."""

TERM_DAYS: Final = (
    "days", "day", "tage", "tagen", "gün", "jours", "dagen", "días", "dias", "giorni",
)
"""The word after `N` in payment terms (`within 30 days`, `30 Tage`, `30 gün`, `30 giorni`)."""
