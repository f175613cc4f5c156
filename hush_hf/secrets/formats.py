"""Terms with a canonical form: every way a reader writes the same phone number or e-mail address.

Separators and case are already set aside by matching (``415-555-0199`` and ``(415) 555 0199`` spell the
same digits); what is left are writings that add or drop characters a reader reads as the same thing:

- **Phone numbers.** A term that libphonenumber parses as a valid number (international with ``+``,
  else in one of :data:`PHONE_REGIONS`) is one E.164 number; it is written with its country code
  (``+1 415 555 0199``, glued: ``+14155550199``), with an international call prefix (``00``, ``011``),
  or nationally (``(415) 555-0199``; with the national prefix: ``020 7946 0958``). :func:`phone_forms`
  gives each writing's digits.
- **E-mail addresses.** ``alice@example.org`` is also written ``alice at example dot org``, ``alice
  {at} example {dot} org``, ``alice(at)example.org``, ``alice(a)example.org``: :func:`email_forms` gives
  every choice of ``@``, ``at`` or ``a`` and of ``.`` or ``dot`` (brackets and spaces are separators already).
"""

from __future__ import annotations

import itertools
import re

PHONE_REGIONS = ("US", "GB", "DE", "FR", "IN")  # as hush_hf.crt.detectors' phone detector
_PHONE_TERM = re.compile(r"^\s*\+?[\d\s().\-/]{6,30}$")
_EMAIL_TERM = re.compile(r"^([A-Za-z0-9._%+-]+)@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)$")
_MAX_EMAIL_DOTS = 6  # 3 x 2^6 forms at most


def phone_forms(term: str) -> list[str]:
    """The digits of every writing of ``term`` as a phone number (module docstring), or ``[]``."""
    if not _PHONE_TERM.match(term) or not 7 <= sum(c.isdigit() for c in term) <= 17:
        return []
    import phonenumbers

    numbers = []
    regions = (None,) if term.strip().startswith("+") else PHONE_REGIONS
    for region in regions:
        try:
            number = phonenumbers.parse(term, region)
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(number):
            numbers.append(number)
    forms: list[str] = []
    for number in numbers:
        code, national = str(number.country_code), phonenumbers.national_significant_number(number)
        written = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.NATIONAL)
        with_prefix = "".join(c for c in written if c.isdigit())
        writings = (code + national, "00" + code + national, "011" + code + national, national, with_prefix)
        for form in (*writings, code + with_prefix):  # the last: +44 (0)20 7946 0958
            if len(form) >= 7 and form not in forms:
                forms.append(form)
    return forms


def email_forms(term: str) -> list[str]:
    """Every writing of the e-mail address ``term`` with ``at`` for ``@`` and ``dot`` for ``.``, or ``[]``."""
    match = _EMAIL_TERM.match(term.strip())
    if match is None:
        return []
    local, domain = match.groups()
    parts = [*local.split("."), *domain.split(".")]
    joins_local = local.count(".")
    dots = len(parts) - 2
    if dots > _MAX_EMAIL_DOTS:
        return []
    forms = []
    for at in ("@", " at ", " (a) "):
        for choice in itertools.product((".", " dot "), repeat=dots):
            joins = [*choice[:joins_local], at, *choice[joins_local:]]
            forms.append(parts[0] + "".join(j + p for j, p in zip(joins, parts[1:], strict=True)))
    return forms


def canonical_forms(term: str) -> list[str]:
    """Other writings of ``term`` that a reader reads as the same phone number or e-mail address."""
    return phone_forms(term) or email_forms(term)
