"""Offline detectors of personal data and credentials: ``detector(text) -> list[Span]``.

Each detector is a pattern plus a check from a well-kept library, all offline:

- ``email``: RFC 5322-style address pattern (local part, ``@``, a dotted domain);
- ``phone``: ``phonenumbers.PhoneNumberMatcher`` (Google's libphonenumber), leniency VALID, for the
  regions given (default ``US``, ``GB``, ``DE``, ``FR``, ``IN``; ``+``-prefixed numbers of any region);
- ``credit_card``: 13-19 digits in groups, kept when ``stdnum.luhn`` validates them;
- ``iban``: country code, check digits and up to 30 characters, kept when ``stdnum.iban`` validates;
- ``ip``: dotted IPv4 / colon IPv6 candidates kept when Python's ``ipaddress`` parses them;
- ``credentials``: detect-secrets' full plugin set (API keys of ~25 services, private-key headers,
  keyword assignments such as ``password = "..."``, high-entropy base64/hex strings), line by line;
  a hit is widened to the whole token around it (a plugin may report only a key's prefix). A private
  key's PEM block (``-----BEGIN ... PRIVATE KEY-----`` to its ``END`` line) is one span, body included,
  whether its lines are real line breaks or ``\n`` escapes inside a one-line string (JSON, code);
  detect-secrets reports only the BEGIN line. Without an END line, the span runs over the base64 body
  that follows (letters, digits, ``+/=``, white space, escapes and string quotes), after any header
  lines (``Proc-Type``, ``DEK-Info`` of a legacy encrypted key). Configuration, connection-string and
  command-line forms the plugins miss (``.env`` and YAML keys, JDBC/ADO.NET/Azure strings, URL
  passwords, ``mysql -p``, XML elements, keys split by concatenation, a high-entropy string next to a
  word naming a secret) are :mod:`hush_hf.crt.credentials`'s.

Why not presidio-analyzer or scrubadub: both install spaCy or scikit-learn/nltk/textblob for the same
pattern + checksum recognizers; their checks are the libraries used here directly.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Sequence

from hush_hf.crt.credentials import credential_form_spans
from hush_hf.crt.spans import Span

DEFAULT_PHONE_REGIONS = ("US", "GB", "DE", "FR", "IN")

EMAIL = re.compile(
    r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)+"
)
CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b")
IPV4 = re.compile(r"(?<!\d)(?<!\d\.)\d{1,3}(?:\.\d{1,3}){3}(?!\d|\.\d)")
IPV6 = re.compile(r"(?<![\w:])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![\w:])")
TOKEN_EDGE = re.compile(r"""[^\s'"`,;()\[\]{}<>]""")
_PEM_LABEL = r"[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?"
PEM_BLOCK = re.compile(rf"-----BEGIN ({_PEM_LABEL})-----.*?-----END \1-----", re.S)
# Without an END line: the BEGIN line, RFC 1421 header lines (legacy encrypted keys: "Proc-Type: 4,ENCRYPTED",
# "DEK-Info: AES-128-CBC,<hex>"), then the base64 body; line breaks real or written as \n escapes.
_PEM_BREAK = r"(?:\r?\n|\\r\\n|\\n)"
PEM_BEGIN = re.compile(
    rf"-----BEGIN {_PEM_LABEL}-----[ \t'\"]*(?:{_PEM_BREAK}[ \t'\"]*[A-Za-z][A-Za-z0-9\-]*:[^\n\\]*)*"
    rf"(?:[A-Za-z0-9+/=\s\\'\"]|\\[nr])*"
)


def pem_spans(text: str) -> list[Span]:
    """Private keys in PEM form, each one span from its BEGIN line through its body (module docstring)."""
    if "-----BEGIN " not in text:
        return []
    spans = [Span(m.start(), m.end(), "credentials") for m in PEM_BLOCK.finditer(text)]
    covered = [(s.start, s.end) for s in spans]
    for m in PEM_BEGIN.finditer(text):
        if not any(start <= m.start() < end for start, end in covered):
            spans.append(Span(m.start(), m.end(), "credentials"))
    return spans


def email_spans(text: str) -> list[Span]:
    return [Span(m.start(), m.end(), "email") for m in EMAIL.finditer(text)]


def phone_detector(regions: Sequence[str] = DEFAULT_PHONE_REGIONS) -> Callable[[str], list[Span]]:
    """Numbers libphonenumber finds valid in any of ``regions`` (ISO 3166 codes)."""
    import phonenumbers

    regions = tuple(regions)
    unknown = [r for r in regions if r not in phonenumbers.SUPPORTED_REGIONS]
    if unknown:
        raise ValueError(f"phone regions: unknown region code {unknown[0]!r}")

    def phone_spans(text: str) -> list[Span]:
        spans = set()
        for region in regions:
            for match in phonenumbers.PhoneNumberMatcher(text, region, leniency=phonenumbers.Leniency.VALID):
                spans.add(Span(match.start, match.end, "phone"))
        return sorted(spans)

    return phone_spans


def credit_card_spans(text: str) -> list[Span]:
    from stdnum import luhn

    out = []
    for m in CARD.finditer(text):
        digits = re.sub(r"\D", "", m.group())
        if 13 <= len(digits) <= 19 and luhn.is_valid(digits):
            out.append(Span(m.start(), m.end(), "credit_card"))
    return out


def iban_spans(text: str) -> list[Span]:
    from stdnum import iban

    return [Span(m.start(), m.end(), "iban") for m in IBAN.finditer(text) if iban.is_valid(m.group())]


def _is_ip(candidate: str) -> bool:
    try:
        ipaddress.ip_address(candidate)
    except ValueError:
        return False
    return True


def ip_spans(text: str) -> list[Span]:
    return [
        Span(m.start(), m.end(), "ip")
        for pattern in (IPV4, IPV6)
        for m in pattern.finditer(text)
        if _is_ip(m.group())
    ]


def _widen(line: str, start: int, end: int) -> tuple[int, int]:
    while start > 0 and TOKEN_EDGE.match(line[start - 1]):
        start -= 1
    while end < len(line) and TOKEN_EDGE.match(line[end]):
        end += 1
    return start, end


class CredentialDetector:
    """detect-secrets' default plugins on each line, each reported value widened to its token, and
    private keys' PEM blocks whole (:func:`pem_spans`).

    The plugins are built once, under detect-secrets' default settings (their limits, e.g. the
    entropy thresholds, are read when they are built).
    """

    def __init__(self) -> None:
        from detect_secrets.settings import default_settings, get_plugins

        with default_settings():
            self.plugins = list(get_plugins())

    def __call__(self, text: str) -> list[Span]:
        spans = pem_spans(text) + credential_form_spans(text)
        offset = 0
        for number, line in enumerate(text.splitlines(keepends=True), start=1):
            for plugin in self.plugins:
                for found in plugin.analyze_line(filename="redact.txt", line=line, line_number=number) or ():
                    value = found.secret_value
                    if not value:
                        continue
                    for m in re.finditer(re.escape(value), line):
                        start, end = _widen(line, m.start(), m.end())
                        spans.append(Span(offset + start, offset + end, "credentials"))
            offset += len(line)
        return spans


DETECTORS: dict[str, Callable[[], Callable[[str], list[Span]]]] = {
    "email": lambda: email_spans,
    "phone": phone_detector,
    "credit_card": lambda: credit_card_spans,
    "iban": lambda: iban_spans,
    "ip": lambda: ip_spans,
    "credentials": CredentialDetector,
}
PII = ("email", "phone", "credit_card", "iban", "ip")
