"""IBAN and VAT id verdicts are kept per string (`checks.IDENTIFIER_CACHE_SIZE`): a party named on
many invoices is judged once, with the same answer every time."""

from lading.validation import checks


def test_a_repeated_iban_or_vat_id_is_judged_once_with_the_same_answer() -> None:
    bad_iban, good_iban, vat_id = "DE89 3704 0044 0532 0130 01", "DE89370400440532013000", "NL123456789B01"
    first = (checks.iban_problem(bad_iban), checks.iban_problem(good_iban), checks.vat_id_problem(vat_id))
    iban_hits, vat_hits = checks.iban_problem.cache_info().hits, checks.vat_id_problem.cache_info().hits
    again = (checks.iban_problem(bad_iban), checks.iban_problem(good_iban), checks.vat_id_problem(vat_id))
    assert again == first
    assert first[1] is None and first[2] is None and first[0] == "fails the ISO 13616 mod-97 checksum"
    assert checks.iban_problem.cache_info().hits == iban_hits + 2
    assert checks.vat_id_problem.cache_info().hits == vat_hits + 1
