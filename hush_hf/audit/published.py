"""``hush verify``'s checks of the published texts: the model card and the privacy report, compared whole.

Every byte of the card's "Secret protection" section and of privacy_report.md is regenerated and
compared, so nothing can be added before, after or inside them:

- privacy_report.json: only the sections hush_hf writes (``REPORT_KEYS``); its certificate, training
  and secrets sections equal the recomputed ones (to ``RTOL``); its format version is this one;
- privacy_report.md: exactly :func:`~hush_hf.audit.report.report_markdown` of that JSON, with the plots
  that the plan and the attacks give (:func:`~hush_hf.audit.plots.report_plot_names`);
- the card: its ``hush_hf`` metadata equals the certificate block; it holds exactly one section between
  the markers, equal to :func:`~hush_hf.audit.card.protection_section` of that JSON, with nothing but
  white space after it, and no other text outside it (the YAML metadata aside) names "secret protection".

A certificate block of another format (1: written before it stated the DP seed's source) is refused in
one line that says so and how to write the card and report again.

The parts no file lets verify recompute (the attacks' results, CRT's section, the evaluation note, the
model name) are taken from privacy_report.json: the card and the Markdown must state what it states.
Without privacy_report.json, the card's section is compared with the one the recomputation alone gives
(no attacks, no CRT section, no evaluation note), and a privacy_report.md alone fails.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hush_hf.audit.certificate import CARD_METADATA_KEY
from hush_hf.planning.consistency import RTOL, Check

#: What build_privacy_report and write_protection_artifacts write; anything else is not hush_hf's.
REPORT_KEYS = ("format_version", "generated_by", "model_name", "training", "secrets", "attacks", "crt",
               "certificate", "evaluation")
RECOMPUTED_KEYS = ("certificate", "training", "secrets")
UNVERIFIED_KEYS = ("generated_by", "model_name", "attacks", "crt", "evaluation")
_GENERATED_BY = re.compile(r"hush_hf [0-9A-Za-z.+!_-]{1,64}")
MODEL_NAME_MAX = 200
#: A second statement of the guarantee: "Secret protection" (any case, any spacing or markup between).
_SECOND_SECTION = re.compile(r"secret[\s*_`~-]*protection", re.IGNORECASE)


def check_report(path: str | Path, recomputed: Mapping[str, Any], plan: Any) -> tuple[Check, dict[str, Any]]:
    """(the check of privacy_report.json and privacy_report.md beside it, the report the card must state:
    the written one when its recomputable sections agree, else the recomputed one with the written
    report's other parts)."""
    from hush_hf.audit.report import REPORT_FORMAT_VERSION, REPORT_MARKDOWN
    from hush_hf.jsonfile import first_difference, read_json

    path = Path(path)
    name = f"privacy report {path.name}"
    if not path.is_file():
        if path.with_name(REPORT_MARKDOWN).is_file():
            return Check(name, False, f"absent, but {REPORT_MARKDOWN} is there: nothing it states can be "
                                      "checked (publish both or neither)"), dict(recomputed)
        return Check(name, None, "absent: not checked"), dict(recomputed)
    written = read_json(path, what="privacy report")
    if not isinstance(written, Mapping):
        return Check(name, False, "not a JSON object"), dict(recomputed)
    basis = {**recomputed, **{k: written[k] for k in UNVERIFIED_KEYS if k in written}}
    unknown = sorted(set(written) - set(REPORT_KEYS))
    if unknown:
        return Check(name, False, f"section {unknown[0]!r} is not one hush_hf writes"), basis
    if written.get("format_version") != REPORT_FORMAT_VERSION:
        return Check(name, False, f"format_version: found {written.get('format_version')!r}, expected "
                                  f"{REPORT_FORMAT_VERSION}"), basis
    problem = _unverified_parts_problem(written)
    if problem is not None:
        return Check(name, False, problem), basis
    older = older_certificate(written.get("certificate"), recomputed.get("certificate"))
    if older is not None:
        return Check(name, False, f"certificate.{older}"), basis
    for key in RECOMPUTED_KEYS:
        difference = first_difference(written.get(key), recomputed.get(key), rtol=RTOL, path=key)
        if difference is not None:
            return Check(name, False, difference), basis
    basis = dict(written)
    markdown = path.with_name(REPORT_MARKDOWN)
    if not markdown.is_file():
        return Check(name, True, "its sections agree with the recomputation "
                                 f"({REPORT_MARKDOWN} absent: not checked)"), basis
    expected = expected_markdown(basis, plan)
    if expected is None:
        return Check(name, False, f"{REPORT_MARKDOWN} cannot be regenerated from {path.name} (a malformed "
                                  "attacks, CRT or evaluation section)"), basis
    found = markdown.read_text(encoding="utf-8")
    if found != expected:
        return Check(name, False, f"{REPORT_MARKDOWN} is not the one its numbers give (nothing may be added, "
                                  f"removed or changed): {first_differing_line(found, expected)}"), basis
    return Check(name, True, f"its sections agree with the recomputation, and {REPORT_MARKDOWN} is exactly "
                             "the one they give"), basis


def expected_markdown(report: Mapping[str, Any], plan: Any) -> str | None:
    """privacy_report.md as hush_hf writes it for ``report`` (None if the report's unverified parts are
    malformed)."""
    from hush_hf.audit.plots import report_plot_names
    from hush_hf.audit.report import report_markdown

    try:
        plots = report_plot_names(plan=plan, attacks=report.get("attacks") or {})
        return report_markdown(report, plots)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None


def check_card(path: str | Path, block: Mapping[str, Any], report: Mapping[str, Any]) -> Check:
    """The card's ``hush_hf`` metadata equals ``block``, and its one Secret protection section is
    exactly the one ``report`` (see :func:`check_report`) gives, with nothing after it and no other
    "secret protection" text outside it."""
    from huggingface_hub.repocard import metadata_load

    from hush_hf.audit.card import SECTION_END, SECTION_START, protection_section
    from hush_hf.jsonfile import first_difference

    path = Path(path)
    name = f"card {path.name}"
    if not path.is_file():
        return Check(name, None, "absent: no card states this certificate")
    try:
        metadata = metadata_load(path) or {}
    except Exception as err:  # noqa: BLE001  (yaml errors have no common base besides Exception)
        return Check(name, False, f"its YAML metadata cannot be read: {' '.join(str(err).split())[:200]}")
    stated = metadata.get(CARD_METADATA_KEY) if isinstance(metadata, Mapping) else None
    if stated is None:
        return Check(name, False, f"no '{CARD_METADATA_KEY}' block in its metadata: it states no certificate")
    older = older_certificate(stated, block)
    if older is not None:
        return Check(name, False, f"metadata {CARD_METADATA_KEY}.{older}")
    difference = first_difference(stated, block, rtol=RTOL, path=CARD_METADATA_KEY)
    if difference is not None:
        return Check(name, False, f"metadata {difference}")
    text = path.read_text(encoding="utf-8")
    starts, ends = text.count(SECTION_START), text.count(SECTION_END)
    if starts != 1 or ends != 1:
        return Check(name, False, f"{starts} Secret protection section start(s) and {ends} end(s), not one "
                                  "section")
    start, end = text.index(SECTION_START), text.index(SECTION_END) + len(SECTION_END)
    if end < start:
        return Check(name, False, "its Secret protection section ends before it starts")
    try:
        expected = protection_section(report).rstrip("\n")
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return Check(name, False, "its Secret protection section cannot be regenerated from the privacy "
                                  "report (a malformed attacks, CRT or evaluation section)")
    found = text[start:end]
    if found != expected:
        return Check(name, False, "its Secret protection section is not the one the recomputation gives "
                                  "(nothing may be added, removed or changed): "
                                  + first_differing_line(found, expected))
    if text[end:].strip():
        return Check(name, False, "text follows its Secret protection section: the section must end the card")
    body = _without_front_matter(text[:start])
    match = _SECOND_SECTION.search(body)
    if match is not None:
        line = text.count("\n", 0, start - len(body) + match.start()) + 1
        return Check(name, False, f"line {line} names 'secret protection' outside its generated section: a "
                                  "second statement of the guarantee, which nothing checks")
    return Check(name, True, "metadata and its whole Secret protection section agree with the recomputation")


def older_certificate(stated: Any, block: Mapping[str, Any] | None) -> str | None:
    """What to say of a certificate block of another format than this hush_hf writes (e.g. format 1,
    which does not state the DP seed's source); None when the formats agree."""
    if not isinstance(stated, Mapping) or block is None:
        return None
    found, expected = stated.get("format_version"), block["format_version"]
    if found == expected:
        return None
    return (f"format_version: found {found!r}, expected {expected} (a certificate of another hush_hf "
            "version, which this one cannot check: write the card and report again with "
            "hush_hf.audit.write_protection_artifacts(folder, plan, clip_norm=the record's C))")


def first_differing_line(found: str, expected: str) -> str:
    a, b = found.splitlines(), expected.splitlines()
    for k in range(max(len(a), len(b))):
        x, y = (a[k] if k < len(a) else "<none>"), (b[k] if k < len(b) else "<none>")
        if x != y:
            return f"line {k + 1}: {x[:80]!r}, expected {y[:80]!r}"
    return "they differ in white space at the end of a line or of the text"


def _unverified_parts_problem(written: Mapping[str, Any]) -> str | None:
    """What is wrong with the written report's parts verify cannot recompute (their form only)."""
    from hush_hf.audit.report import check_attacks

    generated_by = written.get("generated_by")
    if not isinstance(generated_by, str) or not _GENERATED_BY.fullmatch(generated_by):
        return f"generated_by: {str(generated_by)[:80]!r} is not 'hush_hf <version>'"
    model_name = written.get("model_name")
    if model_name is not None and (not isinstance(model_name, str) or len(model_name) > MODEL_NAME_MAX
                                   or any(c in model_name for c in "\r\n")):
        return f"model_name must be one line of at most {MODEL_NAME_MAX} characters"
    try:
        check_attacks(written.get("attacks"))
    except ValueError as err:
        return f"attacks: {err}"
    return None


def _without_front_matter(text: str) -> str:
    """``text`` without a leading YAML block (``---`` ... ``---``)."""
    match = re.match(r"\A---\r?\n.*?\r?\n---[ \t]*(\r?\n|\Z)", text, re.DOTALL)
    return text[match.end():] if match else text
