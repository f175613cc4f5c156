"""Privacy report and model card: contents, files beside the weights, and no secret strings anywhere."""

import json

import numpy as np
import pytest

from hush_hf.accounting import SecretGroups, posterior_bounds
from hush_hf.audit.card import SECTION_END, SECTION_START, build_model_card, write_protection_artifacts
from hush_hf.audit.exposure import CanaryExposure, summarize_exposures
from hush_hf.audit.membership import evaluate_scores
from hush_hf.audit.reconstruction import reconstruct, summarize_reconstructions
from hush_hf.audit.report import build_privacy_report, render_report, report_markdown
from hush_hf.planning import membership_matrix
from hush_hf.planning.plan import ProtectionPlan, SecretReport

SECRET_IDS = [[0], [0], [1], [], [1], [1], [], [2], [], []]
PRIORS = np.array([1e-6, 1e-6, 1e-5])


def make_plan(*, bound_scale: float = 0.9, calibrated: bool = True) -> ProtectionPlan:
    """A plan over 3 secrets and 10 examples, built directly: its bounds are the real ones at
    sigma = 4.25 and T = 300, and each target is bound / bound_scale."""
    weights = np.array([1.0, 1.0, 0.5, 0.0, 1.0, 1.0, 1.0, 0.25, 1.0, 1.0])
    rho = 4.0 * weights / weights.sum()
    membership = membership_matrix(SECRET_IDS, 3)
    groups = SecretGroups.from_membership(membership, rho)
    bound = posterior_bounds(groups, PRIORS, 4.25, 300)
    return ProtectionPlan(
        weights=weights,
        sampling_probs=rho,
        noise_multiplier=4.25,
        accountant="tight",
        budget="tight",
        lp_c=1.0,
        expected_batch_size=4.0,
        steps=300,
        secrets=SecretReport(num_examples=groups.sizes, sum_rho=groups.sum_rho(), prior=PRIORS,
                             target=bound / bound_scale, bound=bound),
        lp={"solver": "highs", "status": "optimal", "gap": 1e-3},
        calibrated=calibrated,
        memberships=membership,
    )


def make_attacks() -> dict:
    """Attack results in the format the attacks produce (built by the package's own summaries)."""
    exposures = [CanaryExposure(0, 3.1, 116_000.0, 10**6, "exact", 10**6, 5),
                 CanaryExposure(1, 0.9, 535_000.0, 10**6, "exact", 10**6, 5)]
    members, nonmembers = np.linspace(0.0, 1.0, 100), np.linspace(-0.01, 0.99, 100)
    plan = make_plan()
    rows = [reconstruct(0, np.array([[-1.0, -2.0, -3.0], [-1.0, -1.5, -2.0]]), plan),
            reconstruct(1, np.array([[-5.0, -1.0, -1.0]]), plan)]
    return {
        "exposure": summarize_exposures(exposures),
        "membership": [evaluate_scores(members, nonmembers, attack="loss").to_json()],
        "reconstruction": summarize_reconstructions(rows, {2: "no tagged examples"}),
        "not_run": {"extraction": "no training data given"},
    }


ATTACKS = make_attacks()


def test_report_numbers_come_from_the_plan():
    plan = make_plan()
    report = build_privacy_report(plan, clip_norm=0.5, attacks=ATTACKS, model_name="tiny")
    t, s = report["training"], report["secrets"]
    assert (t["accountant"], t["noise_multiplier"], t["clip_norm"], t["steps"]) == ("tight", 4.25, 0.5, 300)
    assert t["noise_std"] == pytest.approx(2.125) and t["expected_batch_size"] == 4.0
    assert t["retained_fraction"] == pytest.approx(0.9) and t["max_sampling_prob"] == pytest.approx(4 / 7.75)
    assert s["count"] == 3 and s["meets_targets"] and s["num_over_target"] == 0
    target = plan.secrets.target
    assert s["target"] == {"min": target.min(), "median": np.median(target), "max": target.max(),
                           "mean": pytest.approx(target.mean())}
    assert s["bound_over_target"]["max"] == pytest.approx(0.9, rel=1e-12)
    assert sum(s["histograms"]["target"]["counts"]) == 3
    json.dumps(report, allow_nan=False)  # JSON-ready


def test_markdown_states_warnings_and_attacks():
    plan = make_plan(bound_scale=1.2)
    text = report_markdown(build_privacy_report(plan, clip_norm=1.0, attacks=ATTACKS))
    assert "WARNING: 3 secret(s) have a bound above their target" in text
    auc = ATTACKS["membership"][0]["auc"]
    assert f"| loss | 100 | 100 | {auc:.4g} |" in text
    assert "extraction: not run (no training data given)" in text
    baseline = report_markdown(build_privacy_report(None, clip_norm=None, attacks=ATTACKS))
    assert "carries no certified secret protection" in baseline


@pytest.mark.parametrize("clip_norm", [0.0, -1.0, float("nan"), float("inf"), "1.0", True])
def test_bad_clip_norm_is_refused_before_writing(tmp_path, clip_norm):
    with pytest.raises(ValueError, match="clip_norm"):
        write_protection_artifacts(tmp_path / "out", make_plan(), clip_norm=clip_norm, dp_steps=300)
    assert not (tmp_path / "out").exists()


def test_unknown_attack_sections_are_refused():
    with pytest.raises(ValueError, match="unknown attack sections"):
        build_privacy_report(make_plan(), clip_norm=1.0, attacks={"exposures": {}})


def test_card_states_the_guarantee_in_plain_words():
    report = build_privacy_report(make_plan(), clip_norm=0.5, attacks=ATTACKS)
    card = build_model_card(report, model_name="acme/tiny-model")
    text = str(card)
    assert card.data.tags == ["hush_hf", "secret-protection", "dp-sgd"]
    assert "# acme/tiny-model" in text and "## Secret protection" in text
    assert "3 protected secrets" in text
    assert "guesses it with probability at most its certified bound b_j" in text
    target = make_plan().secrets.target
    lo, hi, median = target.min(), target.max(), np.median(target)
    assert f"Targets range from {lo:.4g} to {hi:.4g} (median {median:.4g})" in text
    assert "hush verify ." in text  # readers are told how to recompute the bounds
    assert "sigma*C = 4.25 * 0.5" in text and "T = 300 DP steps" in text and "`tight` accountant" in text
    assert "Canary exposure: max 3.1 bits" in text
    assert f"AUC {ATTACKS['membership'][0]['auc']:.4g}" in text
    assert "ranked first among its candidates for 1 of 2 secrets" in text
    assert "WARNING" not in text


def test_write_protection_artifacts_writes_everything(tmp_path):
    out = tmp_path / "model"
    paths = write_protection_artifacts(out, make_plan(), clip_norm=0.5, dp_steps=300,
                                       report={"attacks": ATTACKS}, model_name="tiny")
    names = sorted(p.name for p in out.iterdir())
    assert names == ["README.md", "bound_over_target.png", "exposure.png", "hush_plan.json",
                     "privacy_report.json", "privacy_report.md", "reconstruction.png", "targets.png"]
    assert set(paths.values()) == set(out.iterdir())
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in out.glob("*.png"))
    assert ProtectionPlan.load(out / "hush_plan.json").noise_multiplier == 4.25
    assert json.loads((out / "privacy_report.json").read_text())["training"]["clip_norm"] == 0.5


def test_an_existing_readme_keeps_its_text_and_gets_one_section(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("---\nlicense: mit\ntags:\n- generated_from_trainer\n---\n\n"
                      "# My model\n\nTrainer notes.\n")
    for _ in range(2):  # writing twice replaces the section instead of appending a second one
        write_protection_artifacts(tmp_path, make_plan(), clip_norm=1.0, dp_steps=300)
    text = readme.read_text()
    assert text.count(SECTION_START) == 1 and text.count(SECTION_END) == 1
    assert "Trainer notes." in text and "license: mit" in text
    assert "generated_from_trainer" in text and "hush_hf" in text
    assert "No attacks have been run on this model yet" in text


def test_render_report_from_plan_and_audit_files(tmp_path):
    plan_path = make_plan().save(tmp_path / "hush_plan.json")
    audit = tmp_path / "audit.json"
    audit.write_text(json.dumps({"format_version": 1, "clip_norm": 0.75, "attacks": ATTACKS}))
    paths = render_report(plan_path, audit, tmp_path / "report")
    report = json.loads(paths["json"].read_text())
    assert report["training"]["clip_norm"] == 0.75  # recorded in the audit file
    assert report["attacks"]["exposure"]["inserted"]["max"] == 3.1
    assert "![Canary exposure](exposure.png)" in paths["markdown"].read_text()
    assert render_report(plan_path, None, tmp_path / "bare", clip_norm=2.0)["json"].exists()



def test_training_below_the_planned_noise_voids_the_card(tmp_path):
    paths = write_protection_artifacts(tmp_path / "weak", make_plan(), clip_norm=1.0, dp_steps=300,
                                       noise_multiplier=1.0)
    card = paths["card"].read_text()
    assert "training used noise multiplier 1, below the 4.25 the plan calibrated" in card
    assert "carries **no** certified secret protection" in card
    assert "What is guaranteed" not in card
    report = json.loads(paths["json"].read_text())
    assert report["training"]["bounds_hold"] is False and report["training"]["noise_std"] == 1.0
    # More noise than planned keeps every bound (they decrease as sigma grows).
    strong = write_protection_artifacts(tmp_path / "strong", make_plan(), clip_norm=1.0, dp_steps=300,
                                        noise_multiplier=5.0)
    assert "What is guaranteed" in strong["card"].read_text()
    assert json.loads(strong["json"].read_text())["training"]["bounds_hold"] is True
    with pytest.raises(ValueError, match="noise_multiplier"):
        write_protection_artifacts(tmp_path / "bad", make_plan(), clip_norm=1.0, dp_steps=300,
                                   noise_multiplier=-1.0)
    assert not (tmp_path / "bad").exists()
