"""CRT confidentiality in the privacy report and card (CRT Prop. 6, Thm. 8.3), and its per-example eps."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import optimize, stats

from hush_hf.audit.card import write_protection_artifacts
from hush_hf.audit.report import build_privacy_report, render_report, report_markdown
from hush_hf.crt import bayesian_confidentiality, crt_section, example_epsilon
from tests.test_audit_report import make_plan


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact eps(delta) of a Gaussian mechanism with sensitivity/sigma = mu (Balle and Wang 2018):
    delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""

    def gap(eps):
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta

    return optimize.brentq(gap, 0.0, 100.0, xtol=1e-12)


@pytest.mark.parametrize(("sigma", "steps"), [(10.0, 100), (3.0, 4)])
def test_example_epsilon_without_subsampling_matches_the_gaussian_closed_form(sigma, steps):
    exact = gaussian_epsilon(math.sqrt(steps) / sigma, 1e-5)  # T Gaussian steps = one with sigma / sqrt(T)
    got = example_epsilon(1.0, sigma, steps, 1e-5)
    assert exact <= got <= exact * 1.01  # pessimistic, and tight


def test_example_epsilon_subsampling_amplifies_and_edge_cases():
    full = example_epsilon(1.0, 1.0, 50, 1e-5)
    assert example_epsilon(0.01, 1.0, 50, 1e-5) < full / 10
    assert example_epsilon(0.5, 0.0, 50, 1e-5) == math.inf
    assert example_epsilon(0.0, 1.0, 50, 1e-5) == 0.0


def test_crt_section_and_report_markdown_and_json():
    plan = make_plan()
    section = crt_section(
        plan, recall=0.9, training={"schedule": "alternate_epochs", "public_rows": 40, "public_steps": 120}
    )
    eps = example_epsilon(float(plan.sampling_probs.max()), plan.noise_multiplier, plan.steps, 1e-5)
    assert section["example_epsilon"] == eps
    expected = bayesian_confidentiality(eps, 1e-5, recall=0.9, conservative_recall=0.9)
    assert (section["confidentiality_epsilon"], section["confidentiality_delta"]) == expected
    assert section["confidentiality_epsilon"] < eps
    report = build_privacy_report(plan, clip_norm=1.0, crt=section)
    json.dumps(report, allow_nan=False)
    text = report_markdown(report)
    assert "## CRT confidentiality (untagged secrets)" in text
    assert "CRT mode (`alternate_epochs`): 40 public rows" in text
    assert (
        f"**({section['confidentiality_epsilon']:.4g}, {section['confidentiality_delta']:.4g})-Bayesian"
        in text
    )


def test_no_recall_or_no_noise_states_no_confidentiality():
    plan = make_plan()
    text = report_markdown(build_privacy_report(plan, clip_norm=1.0, crt=crt_section(plan, recall=None)))
    assert "No measured recall of the redaction policies was given" in text
    unbounded = crt_section(plan, recall=0.99, noise_multiplier=0.0)
    assert unbounded["unbounded"] and unbounded["example_epsilon"] is None
    report = build_privacy_report(plan, clip_norm=1.0, crt=unbounded, noise_multiplier=0.0)
    json.dumps(report, allow_nan=False)
    assert "has **no** confidentiality guarantee" in report_markdown(report)


def test_card_and_hush_report_carry_the_crt_section(tmp_path):
    plan = make_plan()
    paths = write_protection_artifacts(
        tmp_path / "model", plan, clip_norm=1.0, dp_steps=plan.steps, crt=crt_section(plan, recall=0.8)
    )
    assert "### Redaction (CRT)" in paths["card"].read_text()
    plan_path = plan.save(tmp_path / "plan.json")
    out = render_report(plan_path, None, tmp_path / "report", clip_norm=1.0, crt_recall=0.8)
    report = json.loads(out["json"].read_text())
    assert report["crt"]["recall"] == 0.8
    assert np.isclose(
        report["crt"]["confidentiality_epsilon"], crt_section(plan, recall=0.8)["confidentiality_epsilon"]
    )
    with pytest.raises(ValueError, match="recall must be a number in"):
        render_report(plan_path, None, tmp_path / "bad", clip_norm=1.0, crt_recall=1.5)


# ------------------------------------------------------------------------------ CRT Prop. 7 occurrences
OCCURRENCES = {"rows": [4, 0, 2], "sentences": [5, 0, 2], "unique": [1, 0, 2]}


def test_occurrences_reach_the_report_json_markdown_and_card(tmp_path):
    plan = make_plan()
    section = crt_section(plan, recall=None, occurrences=OCCURRENCES)
    assert section["occurrences"] == OCCURRENCES
    report = build_privacy_report(plan, clip_norm=1.0, crt=section)
    json.dumps(report, allow_nan=False)
    text = report_markdown(report)
    assert "**Occurrences (CRT Prop. 7).**" in text and "at most 2 per secret here" in text
    assert "1 of 3 secrets repeat a sentence" in text
    # Most unique occurrences first: secret 2 (2), secret 0 (1), secret 1 (0).
    assert text.index("| 2 | 2 | 2 | 2 |") < text.index("| 0 | 4 | 5 | 1 |") < text.index("| 1 | 0 | 0 | 0 |")
    card = write_protection_artifacts(tmp_path / "model", plan, clip_norm=1.0, dp_steps=plan.steps,
                                      crt=section)["card"]
    assert "**Occurrences (CRT Prop. 7).**" in card.read_text()


def test_hush_report_takes_the_occurrences_from_a_hush_redact_report(tmp_path):
    plan_path = make_plan().save(tmp_path / "plan.json")
    redaction = tmp_path / "data.jsonl.redaction.json"
    redaction.write_text(json.dumps({"input_rows": 6, "secret_occurrences": OCCURRENCES}))
    out = render_report(plan_path, None, tmp_path / "report", clip_norm=1.0, crt_occurrences=redaction)
    report = json.loads(out["json"].read_text())
    assert report["crt"]["occurrences"] == OCCURRENCES and report["crt"]["recall"] is None
    no_counts = tmp_path / "plain.redaction.json"
    no_counts.write_text(json.dumps({"input_rows": 6}))
    with pytest.raises(ValueError, match=r"plain\.redaction\.json: no secret_occurrences .*--secrets"):
        render_report(plan_path, None, tmp_path / "bad", clip_norm=1.0, crt_occurrences=no_counts)


@pytest.mark.parametrize(
    ("counts", "match"),
    [
        ({"rows": [1, 1, 1]}, r"missing \['unique'\]"),
        ({**OCCURRENCES, "pages": [1, 1, 1]}, r"unknown \['pages'\]"),
        ({"rows": [1, 1], "unique": [1, 1]}, r"occurrences\['rows'\] must hold one count per secret \(3\)"),
        ({"rows": [1, 1, 1], "unique": [1, -1, 1]}, r"occurrences\['unique'\]\[1\] must be an integer >= 0"),
        ({"rows": [1, 1, 1], "unique": [1, 1.5, 1]}, r"occurrences\['unique'\]\[1\] .* got 1\.5"),
        ({"rows": [1, 0, 1], "unique": [1, 1, 1]}, r"secret 1 has unique sentences but no rows"),
        ({"rows": [3, 3, 3], "sentences": [3, 1, 3], "unique": [1, 2, 1]}, r"secret 1 has more unique"),
    ],
)
def test_bad_occurrences_are_refused_naming_the_field(counts, match):
    with pytest.raises(ValueError, match=match):
        crt_section(make_plan(), recall=None, occurrences=counts)


def test_occurrence_counts_of_a_dataset_go_into_the_section_unchanged():
    import datasets

    from hush_hf.crt import occurrence_counts
    from hush_hf.secrets import Secret, SecretSet

    secrets = SecretSet([Secret(name, 1e-6, 1e-3) for name in ("Falcon", "Heron", "Osprey")])
    texts = ["Falcon flies. Falcon flies.", "Osprey dives. Falcon flies.", "nothing here."]
    counts = occurrence_counts(datasets.Dataset.from_dict({"text": texts}), secrets)
    section = crt_section(make_plan(), recall=None, occurrences=counts)
    assert section["occurrences"] == {"rows": [2, 0, 1], "sentences": [3, 0, 1], "unique": [1, 0, 1]}
