"""The arms of CRT's canary experiment (Zhao et al. 2022, Fig. 3): training rows redacted by a policy that
misses a share gamma of the canaries, with and without CRT's dedup and public rows, and their plans.

Canaries are referred to by index: their values never reach a log or a result.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from hush_hf.data import SECRET_IDS_COLUMN
from hush_hf.experiments.planning import plan_for_config

SIX_DIGITS = re.compile(r"(?<!\d)\d{6}(?!\d)")  # pi_c: every canary of the default space (6 digits)
NO_LP = 1e6  # an LP constant so large that every example keeps its weight 1 (uniform sampling)


def redacted_rows(
    train: Any, canaries: Sequence[Any], secrets: Any, gamma: float, *, target: float, mask: str, crt: bool,
    dedup: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """Training rows (a ``text`` column; ``secret_ids`` replaced) at false-negative rate gamma, and what
    was done to them: the policy pi masks the copies of the first (1 - gamma) share of the canaries
    (declared with target ``target``) with ``mask``; with ``crt``, CRT's Dedup first (``dedup``) and pi_c
    (any six-digit number) marks the private rows (``crt_public``). Rows are tagged with every secret."""
    from hush_hf.audit import canary_secret_records
    from hush_hf.crt import Policy, dedup_dataset, redact_dataset, secrets_policy
    from hush_hf.secrets import SecretSet, tag_dataset, tagger_for

    known = len(canaries) - round(gamma * len(canaries))
    record: dict[str, Any] = {"gamma": gamma, "canaries_missed": len(canaries) - known}
    data = train.remove_columns(SECRET_IDS_COLUMN)
    if crt and dedup:
        data, report = dedup_dataset(data, mask_token=mask)
        record.update(dedup_rows_removed=report.rows_in - report.rows_out,
                      dedup_sentences_masked=report.sentences_masked)
    known_set = SecretSet.from_records(canary_secret_records(canaries[:known], target))
    policies = [secrets_policy(known_set)] if known else []
    conservative = [Policy("six_digits", lambda t: [m.span() for m in SIX_DIGITS.finditer(t)])] if crt else []
    if policies or conservative:
        data, report = redact_dataset(data, policies, conservative_policies=conservative, mask_token=mask)
        data = data.remove_columns(["crt_masked_spans"] + ([] if crt else ["crt_public"]))
        record.update(public_rows=report.public_rows, private_rows=report.private_rows)
    return tag_dataset(data, tagger_for(secrets), text_column="text", num_secrets=len(secrets)), record


def crt_plans(config: Any, secret_ids: Any, secrets: Any, uniform_sigma: float) -> dict[str, Any]:
    """The CRT arms' plans on the redacted rows' ``secret_ids`` (which may match no canary: that is
    redaction's point): ``crt`` uniform at uniform DP-SGD's sigma (calibrated higher only if that misses
    a target here) and ``hush_hf_crt`` the LP at ``config.lp_c`` with its own calibrated sigma."""
    crt = plan_for_config(secret_ids, secrets, config, lp_c=NO_LP, noise_multiplier=uniform_sigma,
                          allow_unmatched=True)
    if not crt.meets_targets:
        crt = plan_for_config(secret_ids, secrets, config, lp_c=NO_LP, allow_unmatched=True)
    return {"crt": crt, "hush_hf_crt": plan_for_config(secret_ids, secrets, config, lp_c=config.lp_c,
                                                       allow_unmatched=True)}


def fig3_rows(rows: Sequence[dict[str, Any]], gammas: Sequence[float]) -> list[dict[str, Any]]:
    """CRT Fig. 3's points: every model at every gamma (the arms without redaction at each gamma alike)."""
    return [{**r, "gamma": g} for r in rows for g in gammas if r["gamma"] in (None, g)]


def redacted_arms(
    train: Any, canaries: Sequence[Any], secrets: Any, gamma: float, *, methods: Sequence[str], target: float,
    mask: str, dedup: bool = True,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The rows of the CRT arms in ``methods`` at false-negative rate gamma (:func:`redacted_rows`):
    ``non_private_redacted`` (redacted only) and ``crt`` (dedup and public rows, the rows of ``crt`` and
    ``hush_hf_crt``); and what was done to each, by arm."""
    arms = ["non_private_redacted"] * ("non_private_redacted" in methods)
    arms += ["crt"] * bool({"crt", "hush_hf_crt"} & set(methods))
    data, records = {}, []
    for arm in arms:
        data[arm], record = redacted_rows(train, canaries, secrets, gamma, target=target, mask=mask,
                                          crt=arm == "crt", dedup=dedup)
        records.append({"arm": arm, **record})
    return data, records


def fig3_figure(rows: Sequence[dict[str, Any]], gammas: Sequence[float], path: Any, *, title: str) -> Any:
    """CRT Fig. 3 as PNG: max canary exposure and perplexity of every model against gamma."""
    from hush_hf.experiments.figures import line_panels, series_by

    points = fig3_rows(rows, gammas)
    return line_panels(path, [
        {"title": panel, "xlabel": "false-negative rate gamma of pi", "ylabel": panel,
         "series": series_by(points, "method", "gamma", key), "logy": key == "test_perplexity"}
        for key, panel in (("exposure_max", "max exposure, bits"), ("test_perplexity", "perplexity"))
    ], title=title)


def fig3_sections(rows: Sequence[dict[str, Any]], gammas: Sequence[float]) -> list[tuple[str, str]]:
    """CRT Fig. 3 as ``results.md`` sections: max canary exposure and perplexity per model and gamma, then
    the figure (``crt_fig3.png``)."""
    from hush_hf.experiments.results import pivot_table

    points, sections = fig3_rows(rows, gammas), []
    for key, title in (("exposure_max", "Max canary exposure (bits)"), ("test_perplexity", "Perplexity")):
        table = pivot_table(points, row="method", column="gamma", values={key: ""}, header="gamma = {column}")
        sections.append((f"{title} against gamma (CRT Fig. 3)", table))
    return [*sections, ("", "![CRT Fig. 3](crt_fig3.png)")]
