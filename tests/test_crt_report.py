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
        tmp_path / "model", plan, clip_norm=1.0, crt=crt_section(plan, recall=0.8)
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
