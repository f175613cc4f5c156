"""CRT never trains a credential in a public step (issue 27).

Credentials are generated (fixed seed) in every form of configuration, connection string and command
line the issue lists; the generator knows each credential's value, which is the reference: after
``redact_dataset`` with the ``credentials`` policy no row may keep any piece of it, and no row that held
one may be public. Rows of prose and code without credentials stay public.
"""

from __future__ import annotations

import string

import datasets
import numpy as np
import pytest

from hush_hf.crt import build_policies, redact_dataset

pytest.importorskip("detect_secrets")

SEED = 27
ALNUM = string.ascii_letters + string.digits
BASE64 = ALNUM + "+/"


def _random(rng: np.random.Generator, alphabet: str, size: int) -> str:
    return "".join(rng.choice(list(alphabet), size=size).tolist())


_DB = "Server=db;User ID=sa;Password={};Encrypt=True\n"
_AZURE = "DefaultEndpointsProtocol=https;AccountName=a;AccountKey={};EndpointSuffix=x\n"
_AWS_ID = string.ascii_uppercase + string.digits
FORMS = {
    ".env DB_PASSWORD": lambda r: ("DB_HOST=db\nDB_PASSWORD={}\n", _random(r, ALNUM, 14)),
    ".env SECRET_KEY": lambda r: ("DEBUG=0\nSECRET_KEY={}\n", _random(r, ALNUM, 40)),
    ".env API_KEY hex": lambda r: ("API_KEY={}\n", _random(r, "0123456789abcdef", 32)),
    ".env quoted value": lambda r: ('MAIL_PASSWORD="{}"\n', _random(r, ALNUM, 12) + "!x"),
    "~/.aws/credentials": lambda r: ("[default]\naws_secret_access_key = {}\n", _random(r, BASE64, 40)),
    "export AWS secret": lambda r: ("export AWS_SECRET_ACCESS_KEY={}\n", _random(r, BASE64, 40)),
    "github_pat_": lambda r: ("push with {} please\n", "github_pat_" + _random(r, ALNUM + "_", 82)),
    "redis://:pass@": lambda r: ("REDIS_URL=redis://:{}@cache:6379/0\n", _random(r, ALNUM, 16)),
    "JDBC password=": lambda r: ("jdbc:mysql://db/a?user=u&password={}&useSSL=1\n", _random(r, ALNUM, 12)),
    "ADO.NET Password=": lambda r: (_DB, _random(r, ALNUM, 12)),
    "Azure AccountKey=": lambda r: (_AZURE, _random(r, BASE64, 86) + "=="),
    "docker-compose": lambda r: ("db:\n  environment:\n    POSTGRES_PASSWORD: {}\n", _random(r, ALNUM, 12)),
    "mysql -p": lambda r: ("mysql -u root -p{} shop < dump.sql\n", _random(r, ALNUM, 12)),
    "PGPASSWORD=": lambda r: ("PGPASSWORD={} psql -h db -U app\n", _random(r, ALNUM, 12)),
    "XML <password>": lambda r: ("<ds>\n  <password>{}</password>\n</ds>\n", _random(r, ALNUM, 12)),
    "Java .password=": lambda r: ("spring.datasource.password={}\n", _random(r, ALNUM, 12)),
    "key split by concatenation": lambda r: ("{}", "AKIA" + _random(r, _AWS_ID, 16)),
    "high entropy after a secret word": lambda r: ("aws secret key is {} (rotate)\n", _random(r, BASE64, 40)),
    "--password": lambda r: ("app --password {} --verbose\n", _random(r, ALNUM, 12)),
}


def _pieces(value: str) -> list[str]:
    """Stretches of a value whose survival would leak it: every 8 characters of it."""
    return [value[k : k + 8] for k in range(0, max(1, len(value) - 7), 4)]


def _generated() -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(SEED)
    out = []
    for name, form in FORMS.items():
        for _ in range(3):
            template, value = form(rng)
            text = template.format(value)
            if name == "key split by concatenation":
                cut = int(rng.integers(4, len(value) - 4))
                text = f'aws_id = "{value[:cut]}" + "{value[cut:]}"\n'
            out.append((name, text, value))
    body = "\n".join(_random(rng, BASE64, 64) for _ in range(6))
    header = "Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC," + _random(rng, "0123456789ABCDEF", 32) + "\n\n"
    out.append(
        ("PEM legacy encrypted, no END", "-----BEGIN RSA PRIVATE KEY-----\n" + header + body + "\n", body)
    )
    return out


CLEAN = [
    "We tokenize each sentence and report the F1 score on the test set.",
    "def area(r):\n    return 3.14159 * r * r\n",
    "password = getpass()  # ask the user\n",
    "The authors thank the reviewers; the token budget is 512.",
]


def test_every_credential_form_is_masked_and_no_row_keeping_one_is_public():
    cases = _generated()
    data = datasets.Dataset.from_dict({"text": [text for _, text, _ in cases] + CLEAN})
    redacted, report = redact_dataset(data, build_policies(["credentials"]))
    kept = []
    for k, (name, _, value) in enumerate(cases):
        out = redacted["text"][k]
        if any(piece in out for line in value.split("\n") for piece in _pieces(line)):
            kept.append(name)
        assert not redacted["crt_public"][k], name
    assert not kept, kept
    assert all(redacted["crt_public"][len(cases) :])  # prose and code without credentials stay public
    assert report.private_rows >= len(cases)


def test_a_high_entropy_string_alone_or_a_plain_word_after_a_key_is_not_taken_for_a_credential():
    from hush_hf.crt.credentials import credential_form_spans, looks_random

    assert looks_random("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    assert not looks_random("internationalization")
    assert credential_form_spans("our tokens: words and subwords") == []
    assert credential_form_spans("author = Smith") == []
