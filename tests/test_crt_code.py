"""CRT on code (issue 19): private keys redacted whole, no repeated-line dedup unless asked, and a row is
public only when the plan's own matcher finds no secret in it."""

from __future__ import annotations

import base64
import json

import datasets
import numpy as np
import pytest

from hush_hf.cli import main as hush_main
from hush_hf.crt import build_policies, dedup_dataset, redact_dataset
from hush_hf.crt.detectors import pem_spans
from hush_hf.secrets import SecretSet

pytest.importorskip("detect_secrets")


def _pem(rng: np.random.Generator, label: str = "RSA PRIVATE KEY") -> tuple[str, list[str]]:
    encoded = base64.b64encode(rng.bytes(900)).decode()
    lines = [encoded[k : k + 64] for k in range(0, len(encoded), 64)]
    return "\n".join([f"-----BEGIN {label}-----", *lines, f"-----END {label}-----"]), lines


def _detect_secrets_alone(text: str) -> list[str]:
    """What detect-secrets' default plugins report, line by line (the reference for 'only the BEGIN line')."""
    from detect_secrets.settings import default_settings, get_plugins

    with default_settings():
        plugins = list(get_plugins())
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for plugin in plugins:
            found += [line for _ in plugin.analyze_line(filename="x.py", line=line, line_number=number) or ()]
    return found


@pytest.mark.parametrize("form", ["lines", "json string", "python string", "no END line"])
def test_a_private_key_is_redacted_whole_body_included(form):
    rng = np.random.default_rng(7)
    key, body = _pem(rng)
    if form == "lines":
        text = f"import os\nKEY = '''\n{key}\n'''\nprint(KEY)\n"
    elif form == "json string":
        text = json.dumps({"name": "svc", "private_key": key}) + "\n"
    elif form == "python string":
        text = 'KEY = "' + key.replace("\n", "\\n") + '"\nprint(KEY)\n'
    else:
        text = 'KEY = "' + key.split("-----END")[0].replace("\n", "\\n") + '"  # truncated\n'
    if form == "lines":  # detect-secrets alone reports the header line only: the body would stay
        assert _detect_secrets_alone(text) == ["-----BEGIN RSA PRIVATE KEY-----"]
    data = datasets.Dataset.from_dict({"text": [text, "print('hello')\n"]})
    redacted, report = redact_dataset(data, build_policies(["credentials"]))
    out = redacted["text"][0]
    for line in body:
        assert line not in out and line[:20] not in out, form
    assert "BEGIN RSA" not in out and "<MASK>" in out
    assert out.endswith("print(KEY)\n") or form in ("json string", "no END line")
    assert redacted["crt_public"] == [False, True]
    assert report.policies["credentials"]["rows_marked"] == 1
    spans = pem_spans(text)
    assert len(spans) >= 1 and min(s.start for s in spans) == text.index("-----BEGIN")


def test_certificates_are_not_private_keys():
    rng = np.random.default_rng(3)
    certificate, _ = _pem(rng, "CERTIFICATE")
    assert pem_spans(certificate) == []


CODE = [
    "import os\n\ndef f(x):\n    return None\n",
    "import os\n\ndef g(y):\n    return None\n",
    "import sys\nprint(sys.argv)\n",
]


def test_dedup_leaves_repeated_lines_of_code_alone_unless_asked():
    data = datasets.Dataset.from_dict({"text": CODE + [CODE[0]]})
    out, report = dedup_dataset(data)
    assert out["text"] == CODE  # the exact duplicate row goes, nothing inside a file is masked
    assert (report.exact_duplicates, report.sentences_masked) == ([(3, 0)], 0)
    out, report = dedup_dataset(data, sentences=True)
    assert report.sentences_masked == 2  # "import os" and "return None" in the second file
    assert out["text"][1] == "<MASK>\n\ndef g(y):\n    <MASK>\n"


def test_hush_redact_masks_repeated_lines_only_with_sentence_dedup(tmp_path):
    source = tmp_path / "code.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in CODE))
    for extra, masked in [([], 0), (["--sentence-dedup"], 2)]:
        out = tmp_path / f"out{len(extra)}.jsonl"
        assert hush_main(["redact", "--dataset", str(source), "--output", str(out), *extra]) == 0
        report = json.loads((tmp_path / f"out{len(extra)}.jsonl.redaction.json").read_text())
        assert report["dedup"]["sentences_masked"] == masked


SECRETS = SecretSet.from_records(
    [{"name": "s", "p": 1e-6, "r": 1e-3, "terms": ["zorblattquux", "project nightjar"]}]
)
ROWS = [
    "plain words only\n",
    "a row holding z o r b l a t t q u u x\n",
    "the Project Night\n",  # an occurrence hard-wrapped over two rows
    "jar goes live\n",
    "more plain words\n",
]


@pytest.mark.parametrize("policies", [["pii"], ["secrets"]])
def test_a_row_is_public_only_if_the_plans_matcher_finds_nothing_in_it(policies):
    data = datasets.Dataset.from_dict({"text": ROWS})
    kwargs = {"secret_set": SECRETS} if "secrets" in policies else {}
    redacted, report = redact_dataset(data, build_policies(policies, **kwargs), secrets=SECRETS)
    assert redacted["crt_public"] == [True, False, False, False, True]
    assert report.public_rows == 2
    # Without the plan's secrets, a PII-only redaction would have declared all five rows public.
    plain, _ = redact_dataset(data, build_policies(["pii"]))
    assert all(plain["crt_public"])
