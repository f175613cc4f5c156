"""Layers of reading: markup and escapes decoded pass after pass, to a fixed point.

A reader (a browser, a JSON parser, a mail client, a C compiler) decodes what a text encodes, and a
text can be encoded several times over (``&amp;#110;`` -> ``&#110;`` -> ``n``; ``%2570`` -> ``%70``
-> ``p``; ``\\\\u0072`` -> ``\\u0072`` -> ``r``). One *pass* decodes, left to right and without
overlaps:

- HTML character references, with or without the closing ``;`` (``&#101;``, ``&#101``, ``&#x65``,
  ``&eacute;``, ``&eacute``; a named reference without ``;`` decodes its longest known prefix, as
  browsers and ``html.unescape`` do);
- runs of URL percent-escapes (a UTF-8 sequence spans several);
- backslash escapes of code and JSON strings (``\\n``, ``\\"``, ``\\x41``, ``\\u00e9``, ``\\U0001F600``,
  ``\\u{1F600}``, Python's ``\\N{...}``, C octal ``\\156``; two ``\\u`` escapes of a surrogate pair become
  one character);
- runs of quoted-printable octets (``=6E``, ``=C3=A9``) that decode, as UTF-8, to printable text, and
  soft line breaks (``=`` before a line break);
- markup inside a word: a run of HTML tags and comments with a letter or digit on each side is dropped
  (``nightja<span>r</span>``, ``night<b></b>jar``, ``proj<wbr>ect``, ``proj<!-- -->ect``).

CSS escapes (``\\70 ``: hex digits and an optional white space) read the same characters as C octal
differently, so they are a second chain of passes (:func:`layers` gives both). :func:`layers` applies
passes until nothing changes; every decoded character maps back to the whole original stretch it came
from (:class:`~hush_hf.secrets.normalize.Normalized`), so a match in any layer is a span of the original.
"""

from __future__ import annotations

import html
import re
import unicodedata
from html.entities import html5
from urllib.parse import unquote

from hush_hf.secrets.offsets import Normalized, from_pieces

MAX_PASSES = 8  # each pass shortens the text; no real text nests escapes deeper than this

_HTML = r"&(?:#[0-9]{1,7};?|#[xX][0-9a-fA-F]{1,6};?|[A-Za-z][A-Za-z0-9]{1,31};?)"
_PERCENT = r"(?:%[0-9A-Fa-f]{2})+"
_QUOTED_PRINTABLE = r"(?:=[0-9A-Fa-f]{2})+|=\r?\n"
_MARKUP = r"(?:<!--.*?-->|<[A-Za-z/!?][^<>]{0,256}>)+"
_C_BACKSLASH = (
    r"\\(?:[0-7]{1,3}|[ntrfvab\\'\"/]|x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|u\{[0-9A-Fa-f]{1,6}\}"
    r"|N\{[A-Za-z0-9 \-]{1,88}\})"
)
_CSS_BACKSLASH = r"\\[0-9A-Fa-f]{1,6}(?:\r\n|[ \t\r\n\f])?"
_C_PASS = re.compile("|".join((_HTML, _PERCENT, _C_BACKSLASH, _QUOTED_PRINTABLE, _MARKUP)), re.S)
_CSS_PASS = re.compile(
    "|".join((_HTML, _PERCENT, _CSS_BACKSLASH, _C_BACKSLASH, _QUOTED_PRINTABLE, _MARKUP)), re.S
)
# Where a pass can change anything (one search; most texts have no such place).
_CAN_START = re.compile(
    r"[&%\\=<](?:(?<=&)[#A-Za-z]|(?<=%)[0-9A-Fa-f]{2}|(?<=\\)|(?<==)(?:[0-9A-Fa-f]{2}|\r?\n)|(?<=\w<)[A-Za-z/!?])"
)  # a character set first: the regular-expression engine skips to those characters
_CSS_CAN_START = re.compile(r"\\[0-9A-Fa-f]")
_BACKSLASH = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a", "b": "\b"}
_LONGEST_ENTITY = max(map(len, html5))


def _html_reference(escape: str) -> tuple[int, str] | None:
    """``(length read, decoded)`` of an HTML character reference (named: its longest known prefix)."""
    if escape[1] == "#":
        return len(escape), html.unescape(escape if escape.endswith(";") else escape + ";")
    name = escape[1:]
    if name in html5:
        return len(escape), html5[name]
    for length in range(min(len(name), _LONGEST_ENTITY), 1, -1):
        if name[:length] in html5 and not name[:length].endswith(";"):
            return length + 1, html5[name[:length]]
    return None


def _quoted_printable(escape: str) -> str | None:
    if escape[1] in "\r\n":
        return ""
    try:
        decoded = bytes.fromhex(escape.replace("=", "")).decode("utf-8")
    except UnicodeDecodeError:
        return None
    return decoded if all(c.isprintable() or c.isspace() for c in decoded) else None


def _decode(escape: str, markup_ok: bool, css: bool) -> tuple[int, str] | None:
    """``(length read, decoded)`` of the escape at the start of ``escape``, or None if it is none."""
    first = escape[0]
    if first == "&":
        return _html_reference(escape)
    if first == "%":
        return len(escape), unquote(escape, errors="replace")
    if first == "=":
        decoded = _quoted_printable(escape)
        return None if decoded is None else (len(escape), decoded)
    if first == "<":
        return (len(escape), "") if markup_ok else None
    kind = escape[1]
    if css and kind in "0123456789abcdefABCDEF":  # CSS: hex digits, then one white space ending it
        code = int(escape[1:].strip(), 16)
        return len(escape), chr(code) if 0 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else "\ufffd"
    if kind in _BACKSLASH:
        return len(escape), _BACKSLASH[kind]
    if kind == "N":  # Python's \N{LATIN SMALL LETTER E}
        try:
            return len(escape), unicodedata.lookup(escape[3:-1])
        except KeyError:
            return None
    if kind in "xuU":
        return len(escape), chr(int(escape[2:].strip("{}"), 16))
    if kind in "01234567":  # C octal
        return len(escape), chr(int(escape[1:], 8))
    return len(escape), kind  # \\ \' \" \/


def can_decode(text: str) -> bool:
    """Whether a pass could change ``text`` (substring scans first: most texts have none of ``&%\\=<``)."""
    if "&" not in text and "%" not in text and "\\" not in text and "=" not in text and "<" not in text:
        return False
    return _CAN_START.search(text) is not None


def decode_pass(text: str, *, css: bool = False) -> Normalized:
    """One pass of decoding (module docstring); ``css``: backslash-hex escapes read as CSS."""
    if not can_decode(text):
        return Normalized(text)
    pieces: list[tuple[int, int, str]] = []
    for match in (_CSS_PASS if css else _C_PASS).finditer(text):
        escape, start = match.group(), match.start()
        markup_ok = (
            escape[0] == "<"
            and start > 0
            and match.end() < len(text)
            and text[start - 1].isalnum()
            and text[match.end()].isalnum()
        )
        decoded = _decode(escape, markup_ok, css)
        if decoded is None:
            continue
        length, new = decoded
        end = start + length
        if new == text[start:end]:
            continue
        if pieces and pieces[-1][1] == start and _is_surrogate_pair(pieces[-1][2], new):
            start, _, high = pieces.pop()
            new = (high + new).encode("utf-16-le", "surrogatepass").decode("utf-16-le")
        pieces.append((start, end, new))
    return from_pieces(text, pieces)


def _is_surrogate_pair(high: str, low: str) -> bool:
    return len(high) == 1 and len(low) == 1 and "\ud800" <= high <= "\udbff" and "\udc00" <= low <= "\udfff"


def _chain(text: str, *, css: bool) -> list[Normalized]:
    """The layers of ``text``: each pass's result (offsets into ``text``) until a pass changes nothing."""
    out: list[Normalized] = []
    current = Normalized(text)
    for _ in range(MAX_PASSES):
        later = decode_pass(current.text, css=css)
        if later.starts is None and later.text == current.text:
            break
        current = current.then(later)
        out.append(current)
    return out


def layers(text: str) -> list[Normalized]:
    """Every distinct layer of ``text`` under decoding, deepest first (the fixed point of the C chain,
    its shallower layers, then the CSS chain's), empty when nothing decodes."""
    if not can_decode(text):
        return []
    found = _chain(text, css=False)[::-1]
    if _CSS_CAN_START.search(text):
        seen = {layer.text for layer in found}
        found += [layer for layer in _chain(text, css=True)[::-1] if layer.text not in seen]
    return found


def decoded(text: str) -> Normalized:
    """The deepest layer of ``text`` (the fixed point of decoding), or ``text`` itself."""
    found = _chain(text, css=False) if can_decode(text) else []
    return found[-1] if found else Normalized(text)
