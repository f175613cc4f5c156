"""Credentials written as configuration, connection strings and command lines: ``credential_form_spans``.

detect-secrets' plugins know token formats and some keyword assignments; configuration files and shell
lines write a password or key in forms they miss. Each form below gives the span of the *value*:

- ``KEY = value`` / ``KEY: value`` / ``KEY => value`` where KEY names a secret (:func:`is_secret_key`:
  ``DB_PASSWORD``, ``SECRET_KEY``, ``API_KEY``, ``aws_secret_access_key``, ``POSTGRES_PASSWORD``,
  ``spring.datasource.password``, ``PGPASSWORD``, ``AccountKey``, ADO.NET ``Password``, a JDBC query's
  ``password``; ``export`` lines, JSON and YAML keys, XML attributes), the value quoted, unquoted (up to a
  space, ``;``, ``,``, ``&`` or a quote) or several quoted strings joined by concatenation
  (``"AKIA" + "IOSF..."``); a name followed by ``(`` is a call, not a value (``password = getpass()``);
- XML elements ``<password>value</password>`` (any element whose name names a secret);
- a URL's user information ``scheme://user:password@host`` (``redis://:password@host``);
- command-line options: ``--password value``, ``--password=value``, ``mysql ... -pvalue``,
  ``sshpass -p value``, ``curl -u user:password``;
- token formats the plugins lack (``github_pat_...``, ``glpat-...``);
- a key split by string concatenation anywhere: the joined literals, if they read as a token format or a
  high-entropy string, mask the whole expression;
- a high-entropy string (:func:`looks_random`) within a few characters after a word naming a secret
  (``aws secret key is wJalr...``).
"""

from __future__ import annotations

import math
import re
from collections import Counter

from hush_hf.crt.spans import Span

# Parts of a key's name that say its value is a secret (the name lower-cased, "_", "-", "." removed).
SECRET_KEY_PARTS = (
    "password", "passwd", "passphrase", "pwd", "secret", "token", "apikey", "accesskey", "privatekey",
    "accountkey", "masterkey", "signingkey", "encryptionkey", "authkey", "appkey", "credential",
    "sastoken", "sharedaccesskey", "clientsecret", "sessionkey", "bearer", "cookie",
)  # fmt: skip
_SOURCE = "credentials"
_QUOTED = r"\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|`(?:[^`\\]|\\.)*`"
_CONCAT = rf"(?:{_QUOTED})(?:\s*(?:\+|\|\||\.|&|,)?\s*(?:{_QUOTED}))*"
_KEY = r"(?<![A-Za-z0-9_.$])[A-Za-z_$][A-Za-z0-9_.\-]{0,80}"
_BARE = r"[^\s;,&'\"<>(){}\[\]]+(?![^\s;,&'\"<>){}\[\]])"  # unquoted, not followed by ( (a call)
ASSIGNMENT = re.compile(rf"(?P<key>{_KEY})[\"']?[ \t]*(?:=|:=|:|=>|->)[ \t]*(?P<value>{_CONCAT}|{_BARE})")
XML_ELEMENT = re.compile(r"<(?P<key>[A-Za-z_][\w.\-:]{0,80})(?:\s[^<>]*)?>(?P<value>[^<>\n]+)</(?P=key)>")
URL_USERINFO = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]{1,30}://[^\s:/@'\"]*:(?P<value>[^\s@/'\"]+)@")
OPTIONS = re.compile(
    r"(?<!\S)--?[A-Za-z\-]*(?:password|passwd|passphrase|token|secret|api-?key)(?:=|\s+)(?P<value>[^\s'\"]+|"
    + _QUOTED
    + r")",
    re.I,
)
MYSQL_P = re.compile(r"\b(?:mysql\w*|mariadb\w*)\b[^\n]*?(?<!\S)-p(?P<value>[^\s'\"]+)")
SSHPASS = re.compile(r"\bsshpass\s+-p\s*(?P<value>\S+)")
CURL_USER = re.compile(r"(?<!\S)(?:-u|--user)\s+[^\s:]+:(?P<value>[^\s'\"]+)")
TOKEN_FORMATS = re.compile(
    r"\b(?:github_pat_[A-Za-z0-9_]{22,}|gh[pousr]_[A-Za-z0-9]{30,}|glpat-[A-Za-z0-9_\-]{20,}"
    r"|AKIA[0-9A-Z]{16}|ASIA[0-9A-Z]{16}|xox[abposr]-[A-Za-z0-9\-]{10,}|sk-[A-Za-z0-9_\-]{20,}"
    r"|AIza[0-9A-Za-z_\-]{35})"
)
CONCATENATION = re.compile(rf"(?:{_QUOTED})(?:\s*(?:\+|\|\||\.|&)?\s*(?:{_QUOTED}))+")
TOKEN = re.compile(r"[A-Za-z0-9+/_\-.=~]{16,}")
SECRET_WORD = re.compile(
    r"pass(?:word|wd|phrase)|pwd|secret|token|api[ _-]?key|access[ _-]?key|private[ _-]?key|account[ _-]?key"
    r"|credential|\bauth(?:orization)?\b",
    re.I,
)
_NEAR = 48  # characters after a secret word in which a high-entropy string makes it a credential


def is_secret_key(name: str) -> bool:
    """Whether a key (variable, setting, element or option name) names a secret: an identifier holding
    a part of :data:`SECRET_KEY_PARTS` (``DB_PASSWORD``, ``AccountKey``), or a plain word that is one
    (``password``, ``Password``; not ``tokens`` in prose)."""
    flat = re.sub(r"[_.\-$]", "", name.lower())
    if name.isalpha() and (name.islower() or name.istitle()):  # a plain word: only a secret's own name
        return flat in SECRET_KEY_PARTS or flat in ("pass", "pw")
    return (
        any(part in flat for part in SECRET_KEY_PARTS)
        or flat in ("pass", "pw")
        or (name.lower().endswith(("_pass", ".pass", "-pass")))
    )


def shannon_entropy(value: str) -> float:
    """Bits per character of ``value``'s character frequencies."""
    counts = Counter(value)
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())


def looks_random(value: str) -> bool:
    """At least 16 characters mixing letters and digits, with at least 3 bits of entropy per character
    (detect-secrets' hex threshold; random base64 has ~4.5-6, English words stay below)."""
    return (
        len(value) >= 16
        and any(c.isdigit() for c in value)
        and any(c.isalpha() for c in value)
        and shannon_entropy(value) >= 3.0
    )


def _joined_literals(expression: str) -> str:
    return "".join(part[1:-1] for part in re.findall(_QUOTED, expression, flags=re.S))


def credential_form_spans(text: str) -> list[Span]:
    """Spans of the credential values written in the forms of the module docstring."""
    spans: list[Span] = []
    add = spans.append
    for match in ASSIGNMENT.finditer(text):
        if is_secret_key(match.group("key")) and match.group("value").strip("\"'`"):
            add(Span(match.start("value"), match.end("value"), _SOURCE))
    for match in XML_ELEMENT.finditer(text):
        if is_secret_key(match.group("key").split(":")[-1]) and match.group("value").strip():
            add(Span(match.start("value"), match.end("value"), _SOURCE))
    for pattern in (URL_USERINFO, OPTIONS, MYSQL_P, SSHPASS, CURL_USER):
        for match in pattern.finditer(text):
            add(Span(match.start("value"), match.end("value"), _SOURCE))
    spans += [Span(m.start(), m.end(), _SOURCE) for m in TOKEN_FORMATS.finditer(text)]
    for match in CONCATENATION.finditer(text):
        joined = _joined_literals(match.group())
        if TOKEN_FORMATS.search(joined) or looks_random(joined):
            add(Span(match.start(), match.end(), _SOURCE))
    for word in SECRET_WORD.finditer(text):
        line_end = text.find("\n", word.end())
        window_end = min(len(text) if line_end < 0 else line_end, word.end() + _NEAR)
        for token in TOKEN.finditer(text, word.end(), window_end):
            if looks_random(token.group().strip("=.-_")):
                add(Span(token.start(), token.end(), _SOURCE))
    return spans
