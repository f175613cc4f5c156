"""Plans are re-verified before anything is certified: digest, recomputed bounds at train start,
reports and cards from those bounds only, and `hush verify` (exit 0/1/2)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hush_hf.accounting import SecretGroups, posterior_bounds
from hush_hf.cli import main
from hush_hf.planning import membership_matrix, plan_protection
from hush_hf.planning.plan import ProtectionPlan, content_digest
from hush_hf.planning.verification import recompute_bounds
from hush_hf.trainer import SecretProtectionTrainer
from tests.test_trainer_helpers import (
    dp_config,
    pad_collate,
    single_thread,  # noqa: F401  (autouse fixture)
    tiny_gpt2,
    token_dataset,
)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")

SECRET_IDS = [[0], [0], [1], [], [1], [0, 1], [], [2], [2], []]
PRIORS, TARGETS = np.array([1e-3, 1e-3, 1e-4]), np.array([0.05, 0.1, 0.01])
STEPS = 2


@pytest.fixture(scope="module")
def plan() -> ProtectionPlan:
    return plan_protection(tagged_dataset(), PRIORS, TARGETS, expected_batch_size=2.0, steps=STEPS)


def reference_bounds(plan: ProtectionPlan, sigma: float) -> np.ndarray:
    """Independent of the plan's numbers: memberships from SECRET_IDS, rho from the plan's weights."""
    rho = 2.0 * plan.weights / plan.weights.sum()
    groups = SecretGroups.from_membership(membership_matrix(SECRET_IDS, 3), rho)
    return np.asarray(posterior_bounds(groups, PRIORS, sigma, STEPS, accountant="tight"))


def edited(plan: ProtectionPlan, path, *, resign: bool):
    """The local plan file's JSON with noise_multiplier divided by 10, as a user might edit it; ``resign``
    also recomputes the digest (a deliberate forgery, which only the recomputed bounds can catch)."""
    data = plan.to_json(include_fingerprint=True)
    data["noise_multiplier"] /= 10
    if resign:
        data["digest"] = content_digest(data)
    path.write_text(json.dumps(data))
    return path


def tagged_dataset():
    return token_dataset(len(SECRET_IDS)).add_column("secret_ids", SECRET_IDS)


def trainer_for(tmp_path, plan, **overrides):
    return SecretProtectionTrainer(
        model=tiny_gpt2(seed=0),
        args=dp_config(tmp_path / "run", max_steps=STEPS, **overrides),
        train_dataset=tagged_dataset(),
        data_collator=pad_collate,
        plan=plan,
    )


def test_recomputed_bounds_match_an_independent_evaluation(plan):
    verification = recompute_bounds(plan)
    np.testing.assert_allclose(verification.bound, reference_bounds(plan, plan.noise_multiplier), rtol=1e-12)
    assert verification.meets_targets and verification.memberships_from == "the plan"
    weak = recompute_bounds(plan, plan.noise_multiplier / 10, secret_ids=SECRET_IDS)
    assert not weak.meets_targets and weak.memberships_from == "the dataset's secret_ids"
    assert "exceed their targets" in weak.describe()


def test_an_edited_plan_file_is_refused_because_its_digest_no_longer_matches(plan, tmp_path):
    path = edited(plan, tmp_path / "plan.json", resign=False)
    with pytest.raises(ValueError, match="was edited after hush_hf wrote it"):
        ProtectionPlan.load(path)
    with pytest.raises(ValueError, match="was edited after hush_hf wrote it"):
        trainer_for(tmp_path, str(path))
    data = plan.to_json()
    del data["digest"]
    (tmp_path / "nodigest.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="has no digest"):
        ProtectionPlan.load(tmp_path / "nodigest.json")


def test_a_forged_plan_with_a_valid_digest_is_refused_by_the_recomputed_bounds(plan, tmp_path):
    forged = ProtectionPlan.load(edited(plan, tmp_path / "forged.json", resign=True))
    assert forged.meets_targets  # the bounds in the file still claim every target holds
    with pytest.raises(ValueError, match="does NOT meet its targets: .* 3 of 3 secrets exceed") as info:
        trainer_for(tmp_path, forged)
    assert "set noise_multiplier explicitly" in str(info.value)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_with_an_explicit_noise_multiplier_it_trains_loudly_and_the_card_states_recomputed_bounds(
    plan, tmp_path
):
    sigma = plan.noise_multiplier / 10
    with pytest.warns(UserWarning, match="certified per-secret targets do NOT hold"):
        trainer = trainer_for(tmp_path, plan, noise_multiplier=sigma)
    trainer.train()
    trainer.save_model()
    out = tmp_path / "run"
    report = json.loads((out / "privacy_report.json").read_text())
    expected = reference_bounds(plan, sigma)
    assert report["secrets"]["bound"]["max"] == pytest.approx(expected.max(), rel=1e-12)
    assert report["secrets"]["num_over_target"] == 3 and not report["secrets"]["meets_targets"]
    saved = ProtectionPlan.load(out / "hush_plan.json")  # the published plan carries the same bounds
    np.testing.assert_allclose(saved.secrets.bound, expected, rtol=1e-12)
    card = (out / "README.md").read_text()
    assert "the targets do NOT hold" in card and "Each bound is at most the target" not in card
    assert main(["verify", str(out)]) == 1  # what was saved, re-checked from the outside


def test_a_calibrated_plan_trains_and_its_card_certifies_the_recomputed_bounds(plan, tmp_path):
    trainer = trainer_for(tmp_path, plan)
    np.testing.assert_allclose(
        trainer.dp.verification.bound, reference_bounds(plan, plan.noise_multiplier), rtol=1e-12
    )
    trainer.train()
    trainer.save_model()
    card = (tmp_path / "run" / "README.md").read_text()
    assert "Each bound is at most the target r_j" in card and "hush verify ." in card
    assert main(["verify", str(tmp_path / "run")]) == 0


def test_a_plan_made_with_too_little_noise_is_refused_unless_the_noise_is_explicit(plan, tmp_path):
    weak = plan_protection(
        tagged_dataset(), PRIORS, TARGETS, expected_batch_size=2.0, steps=STEPS,
        noise_multiplier=plan.noise_multiplier / 4,
    )
    with pytest.raises(ValueError, match="does NOT meet its targets"):
        trainer_for(tmp_path, weak)
    with pytest.warns(UserWarning, match="do NOT hold"):
        trainer_for(tmp_path, weak, noise_multiplier=weak.noise_multiplier)
