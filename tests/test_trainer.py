"""SecretProtectionTrainer / GhostClippingCallback inside Trainer: logs, secrecy, plans, resume, attach."""

from __future__ import annotations

import functools
import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Trainer, TrainingArguments

from hush_hf.clipping import UnsupportedLayerError
from hush_hf.planning.binding import RowBinding
from hush_hf.planning.plan import ProtectionPlan
from hush_hf.trainer import GhostClippingCallback, SecretProtectionTrainer
from tests.test_trainer_helpers import (
    dp_config,
    make_plan,
    pad_collate,
    parameters,
    single_thread,  # noqa: F401  (autouse fixture)
    tiny_gpt2,
    token_dataset,
)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")

SEED = 314159265358979323846264338327950288
PLAN_CHECK_COLUMNS = {"secret_ids", "hush_sampling_prob"}


def build(tmp_path, n=8, *, plan=None, model=None, dataset=None, eval_dataset=None, attach=True, **overrides):
    """A trainer on ``dataset`` (default: n token rows); ``attach``: a plan bound to no rows is bound to
    ``dataset`` (as plan_protection(dataset) binds it), and attached to it unless it has ``secret_ids``."""
    model = model or tiny_gpt2(seed=0)
    plan = plan or make_plan(np.full(n, 0.5), steps=overrides.get("max_steps", 2), noise_multiplier=1.0)
    dataset = token_dataset(n) if dataset is None else dataset
    if attach and isinstance(plan, ProtectionPlan):
        plan = plan if plan.rows is not None else replace(plan, rows=RowBinding.of(dataset))
        if not PLAN_CHECK_COLUMNS & set(dataset.column_names):
            dataset = plan.attach(dataset)
    return SecretProtectionTrainer(
        model=model,
        args=dp_config(tmp_path, **overrides),
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        data_collator=pad_collate,
        plan=plan,
    )


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def seed_encodings(seed: int) -> dict[str, bytes]:
    """The ways a 128-bit seed could sit in a file: decimal, hex (either case, 0x or not), the 16 raw
    bytes (either byte order) and their base64/hex forms, and the decimal text in UTF-16."""
    import base64

    raw = {order: seed.to_bytes(16, order) for order in ("big", "little")}
    forms = {
        "decimal": str(seed).encode(),
        "hex": format(seed, "x").encode(),
        "HEX": format(seed, "X").encode(),
        "decimal-utf16": str(seed).encode("utf-16-le"),
    }
    for order, data in raw.items():
        forms[f"bytes-{order}"] = data
        forms[f"base64-{order}"] = base64.b64encode(data).rstrip(b"=")
        forms[f"hex-bytes-{order}"] = data.hex().encode()
    return forms


def files_holding(folder: Path, seed: int) -> list[str]:
    """Every file under ``folder`` (recursively, any file) whose bytes hold the seed in any encoding."""
    forms = seed_encodings(seed)
    return sorted(
        f"{name} ({form})"
        for name, data in files_under(folder).items()
        for form, b in forms.items()
        if b in data
    )


def stored_seed(state_dir: Path, output_dir: Path, step: int) -> tuple[int, Path]:
    """The seed a checkpoint's run keeps in ``state_dir`` (read as the resume does) and its file."""
    from hush_hf.trainer.seed_store import load_dp_seed, seed_path

    run_id = json.loads((output_dir / f"checkpoint-{step}" / "hush_state.json").read_text())["run_id"]
    return load_dp_seed(state_dir, run_id, checkpoint=None), seed_path(state_dir, run_id)


def test_logs_carry_sigma_and_batch_size_but_no_grad_norm(tmp_path):
    trainer = build(
        tmp_path,
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
        dp_seed=SEED,
        eval_dataset=token_dataset(4, seed=5),
        eval_strategy="steps",
        eval_steps=2,
    )

    def no_batch_norm(*args, **kwargs):
        raise AssertionError("Trainer computed a norm of the pre-noise gradient")

    trainer.accelerator.clip_grad_norm_ = no_batch_norm
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    trainer.save_state()
    train_logs = [log for log in trainer.state.log_history if "loss" in log]
    assert len(train_logs) == 4
    assert len([log for log in trainer.state.log_history if "eval_loss" in log]) == 2  # evaluation works
    for log in train_logs:
        assert "grad_norm" not in log
        assert log["dp_noise_multiplier"] == 1.0
        assert log["dp_batch_size"] == int(log["dp_batch_size"]) >= 0
    assert (tmp_path / "final" / "training_args.bin").is_file()
    assert files_holding(tmp_path, SEED) == []
    states = [data for name, data in files_under(tmp_path).items() if name.endswith("trainer_state.json")]
    assert len(states) == 3 and all(b'"grad_norm"' not in data for data in states)


def test_a_seed_file_made_private_is_created_owner_only(tmp_path):
    from hush_hf.trainer.seed_store import load_dp_seed, new_run_id, save_dp_seed

    folder, run_id = tmp_path / "fresh" / "dp_state", new_run_id()
    path = save_dp_seed(folder, run_id, SEED)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_dp_seed(folder, run_id, checkpoint=None) == SEED
    assert save_dp_seed(folder, run_id, SEED) == path  # written once; the same seed again is a no-op
    with pytest.raises(RuntimeError, match="holds another seed than this run's"):
        save_dp_seed(folder, run_id, SEED + 1)
    assert sorted(os.listdir(folder)) == [path.name]  # no temporary file left behind


def test_resumed_run_ends_exactly_where_the_uninterrupted_run_does(tmp_path):
    """4 steps with a checkpoint at step 2, resumed from it in a new trainer (no dp_seed given:
    the secret seed must come from dp_state_dir, found through the checkpoint's run id), ends with the
    same parameters."""
    plan = make_plan(np.full(10, 0.4), steps=4, noise_multiplier=0.7)
    first = build(
        tmp_path,
        10,
        plan=plan,
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
        dp_seed=None,
        learning_rate=5e-2,
        lr_scheduler_type="linear",
        optim="adamw_torch",
    )
    first.train()
    uninterrupted = parameters(first.model)

    resumed = build(
        tmp_path,
        10,
        plan=plan,
        model=tiny_gpt2(seed=9),
        max_steps=4,
        save_strategy="no",
        dp_seed=None,
        learning_rate=5e-2,
        lr_scheduler_type="linear",
        optim="adamw_torch",
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert resumed.state.global_step == 4
    assert resumed.dp.steps_behind(resumed.state.global_step) == (4, 0)  # the record counts all 4 steps
    for name, value in parameters(resumed.model).items():
        torch.testing.assert_close(value, uninterrupted[name], rtol=0, atol=1e-6)


def test_resume_without_the_seed_file_is_refused_in_one_line_and_exact_once_it_is_provided(
    tmp_path, private_dp_state_dir
):
    """The seed is not in the checkpoint: with another dp_state_dir the resume is refused before any step,
    naming the file it looked for and how to provide it; with the file copied there it is exact."""
    plan = make_plan(np.full(10, 0.4), steps=4, noise_multiplier=0.7)
    kwargs = dict(plan=plan, max_steps=4, dp_seed=None, learning_rate=5e-2)
    first = build(tmp_path / "out", 10, save_strategy="steps", save_steps=2, **kwargs)
    first.train()
    seed, seed_file = stored_seed(private_dp_state_dir, tmp_path / "out", 2)
    elsewhere = tmp_path / "other_machine"
    resumed = build(tmp_path / "out", 10, model=tiny_gpt2(seed=9), dp_state_dir=str(elsewhere), **kwargs)
    before = parameters(resumed.model)
    with pytest.raises(ValueError) as info:
        resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"cannot resume checkpoint '{tmp_path / 'out' / 'checkpoint-2'}': the secret DP seed of its run is "
        f"not in '{elsewhere / seed_file.name}'. Put the file {seed_file.name} from the dp_state_dir of the "
        "machine that trained it there, or point dp_state_dir (or $HUSH_HF_DP_STATE_DIR) at the folder "
        "holding it."
    )
    assert "start again from step 0 with a fresh model" in message
    assert all(str(v) not in message for v in seed_encodings(seed).values())
    assert resumed.state.global_step == 0
    for name, value in parameters(resumed.model).items():
        assert torch.equal(value, before[name]), name  # no step taken
    elsewhere.mkdir()
    (elsewhere / seed_file.name).write_bytes(seed_file.read_bytes())  # what the message says to do
    resumed = build(tmp_path / "out", 10, model=tiny_gpt2(seed=9), dp_state_dir=str(elsewhere), **kwargs)
    resumed.train(resume_from_checkpoint=True)  # the last checkpoint: step 4, nothing left to train
    assert resumed.state.global_step == 4
    again = build(tmp_path / "out", 10, model=tiny_gpt2(seed=9), dp_state_dir=str(elsewhere), **kwargs)
    again.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    for name, value in parameters(again.model).items():
        assert torch.equal(value, parameters(first.model)[name]), name  # bit-exact
    with pytest.raises(ValueError, match="dp_seed was given but is not the seed the checkpoint's run was "
                                         "trained with"):
        build(tmp_path / "out", 10, **{**kwargs, "dp_seed": seed + 1}).train(resume_from_checkpoint=True)


def test_the_seed_folder_must_lie_outside_output_dir(tmp_path, monkeypatch):
    from hush_hf.trainer.seed_store import DP_STATE_DIR_ENV, default_dp_state_dir

    out = tmp_path / "out"
    inside = f"dp_state_dir '{out / 'seeds'}' \\(dp_state_dir\\) lies inside output_dir '{out}': uploading"
    with pytest.raises(ValueError, match=inside + " output_dir would publish the secret DP seed"):
        build(out, dp_state_dir=str(out / "seeds"))
    monkeypatch.setenv(DP_STATE_DIR_ENV, str(out))
    with pytest.raises(ValueError, match="lies inside output_dir"):
        build(out)
    plan = make_plan(np.full(8, 0.5), steps=2, noise_multiplier=1.0, rows=token_dataset(8))
    trainer = Trainer(model=tiny_gpt2(), args=TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, max_grad_norm=0.0, report_to=[], use_cpu=True),
        train_dataset=plan.attach(token_dataset(8)), data_collator=pad_collate)
    with pytest.raises(ValueError, match="lies inside output_dir"):
        GhostClippingCallback.attach(trainer, plan, dp_state_dir=str(tmp_path / "a" / "b"))
    monkeypatch.delenv(DP_STATE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_dp_state_dir() == tmp_path / "xdg" / "hush_hf" / "dp_state"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_dp_state_dir() == tmp_path / "home" / ".cache" / "hush_hf" / "dp_state"


def test_a_corrupt_hush_state_json_is_one_line_naming_the_file(tmp_path):
    plan = make_plan(np.full(8, 0.5), steps=2, noise_multiplier=1.0)
    build(tmp_path, plan=plan, save_strategy="steps", save_steps=1).train()
    state_file = tmp_path / "checkpoint-1" / "hush_state.json"
    good = json.loads(state_file.read_text())
    source = f"DP state file '{state_file}'"
    cases = [
        ('{"format_version": 2, "run_id": ', f"{source} is not valid JSON at line 1, column 33"),
        (json.dumps({k: v for k, v in good.items() if k != "steps"}), f"{source}: missing field 'steps'"),
        (json.dumps({**good, "global_step": "1"}), f"{source}: global_step must be an integer, got a str"),
        (json.dumps({**good, "run_id": "x"}), f"{source}: run_id must be 32 lowercase hex digits"),
        (json.dumps([good]), f"{source}: expected a JSON object, got a list"),
        (json.dumps(good)[:-1] + ', "steps": 3}', f"{source}: line 1: one object has the field 'steps' "),
        (json.dumps({**good, "format_version": 1}), f"{source}: format_version=1 is not supported"),
    ]
    for text, message in cases:
        state_file.write_text(text)
        with pytest.raises(ValueError) as info:
            build(tmp_path, plan=plan).train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
        assert str(info.value).startswith(message), (text, str(info.value))
        assert "\n" not in str(info.value)


def test_resume_refuses_changed_dp_parameters_or_a_non_dp_checkpoint(tmp_path):
    plan = make_plan(np.full(8, 0.5), steps=2, noise_multiplier=1.0)
    build(tmp_path, plan=plan, save_strategy="steps", save_steps=1).train()
    with pytest.raises(
        ValueError,
        match="checkpoint was trained with noise_multiplier=1.0 but this run has noise_multiplier=2.0",
    ):
        build(tmp_path, plan=plan, noise_multiplier=2.0).train(resume_from_checkpoint=True)
    other = make_plan(np.full(8, 0.25), steps=2, noise_multiplier=1.0, expected_batch_size=4.0)
    with pytest.raises(ValueError, match="plan samples differently"):
        build(tmp_path, plan=other).train(resume_from_checkpoint=True)
    (tmp_path / "checkpoint-1" / "hush_state.json").unlink()
    with pytest.raises(ValueError, match="has no hush_state.json/hush_plan.json"):
        build(tmp_path, plan=plan).train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))


def test_training_twice_without_resuming_is_refused(tmp_path):
    trainer = build(tmp_path)
    trainer.train()
    with pytest.raises(ValueError, match="already took 2 DP steps"):
        trainer.train()


def test_plan_must_fit_the_run_and_the_rows(tmp_path):
    plan = make_plan(np.full(8, 0.5), steps=2, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="max_steps=3 but the plan is calibrated for steps=2"):
        build(tmp_path, plan=plan, max_steps=3)
    with pytest.raises(
        ValueError,
        match=r"expected_batch_size=5.0 but the plan is calibrated for "
        r"expected_batch_size=4.0",
    ):
        build(tmp_path, plan=plan, expected_batch_size=5.0)
    with pytest.raises(ValueError, match="train_dataset has 9 rows but the plan covers 8 examples"):
        build(tmp_path, plan=plan, dataset=token_dataset(9), attach=False)


def test_dataset_reordered_or_retagged_after_planning_is_refused(tmp_path):
    n = 12
    rho = np.linspace(0.05, 0.6, n)
    secret_ids = [[i % 3] for i in range(n)]
    tagged = token_dataset(n).add_column("secret_ids", secret_ids)
    plan = make_plan(rho, steps=2, noise_multiplier=1.0, secret_ids=secret_ids, rows=tagged)
    build(tmp_path, n, plan=plan, dataset=tagged)  # in planning order: accepted
    shuffled = tagged.shuffle(seed=0)
    moved = sum(a != b for a, b in zip(shuffled["input_ids"], tagged["input_ids"], strict=True))
    with pytest.raises(ValueError, match=rf"differs from the rows the plan was made from at {moved} of 12"):
        build(tmp_path, n, plan=plan, dataset=shuffled)
    # Same rows, other secret ids (re-tagged after planning): each row's ids are compared with the plan's.
    retagged = token_dataset(n).add_column("secret_ids", [[(i + 1) % 3] for i in range(n)])
    with pytest.raises(ValueError, match=r"'secret_ids' differ from the plan's memberships at 12 rows"):
        build(tmp_path, n, plan=plan, dataset=retagged)
    attached = plan.attach(token_dataset(n))
    build(tmp_path, n, plan=plan, dataset=attached)
    other = make_plan(rho[::-1].copy(), steps=2, noise_multiplier=1.0, secret_ids=secret_ids, rows=tagged)
    with pytest.raises(ValueError, match="'hush_sampling_prob' differs from the plan at 12 rows"):
        build(tmp_path, n, plan=plan, dataset=other.attach(token_dataset(n)))


def test_noise_below_the_calibrated_sigma_warns_loudly(tmp_path):
    with pytest.warns(
        UserWarning,
        match=r"noise_multiplier=0.5 is below the plan's calibrated 1: the certified "
        r"per-secret targets do NOT hold",
    ):
        build(tmp_path, noise_multiplier=0.5)
    with pytest.warns(UserWarning, match="noise_multiplier=0: training WITHOUT noise"):
        build(tmp_path, noise_multiplier=0.0)


def test_undercutting_the_calibrated_noise_states_the_bounds_it_gives(tmp_path):
    from hush_hf.accounting import SecretGroups, posterior_bounds
    from hush_hf.planning.memberships import membership_matrix
    from hush_hf.planning.plan import plan_protection

    secret_ids = [[0], [0], [1], [], [1], [0, 1], [], []]
    priors, targets = np.full(2, 1e-3), np.full(2, 0.2)
    plan = plan_protection(secret_ids, priors, targets, expected_batch_size=2.0, steps=2)
    dataset = token_dataset(8).add_column("secret_ids", secret_ids)
    sigma = plan.noise_multiplier / 2
    with pytest.warns(UserWarning, match="certified per-secret targets do NOT hold") as caught:
        build(tmp_path, plan=plan, dataset=dataset, noise_multiplier=sigma)
    (message,) = [str(w.message) for w in caught if "do NOT hold" in str(w.message)]
    groups = SecretGroups.from_membership(membership_matrix(secret_ids, 2), plan.sampling_probs)
    ratio = posterior_bounds(groups, priors, sigma, 2, accountant="tight") / targets
    assert ratio.max() > 1
    assert f"bound/target {ratio.max():.4g}" in message
    assert f"{int(np.sum(ratio > 1))} of 2 secrets exceed their targets" in message


def test_plan_columns_never_reach_the_collator_or_the_model(tmp_path):
    from hush_hf.secrets.tagging import text_digests

    n = 8
    tagged = token_dataset(n).add_column("text", [f"row {i}" for i in range(n)])
    tagged = tagged.add_column("secret_ids", [[0]] * n)  # and the tagged-text digests tag_dataset writes:
    digests = text_digests(tagged["text"], "text").tolist()
    tagged = tagged.add_column("secret_ids__hush_tagged_text__text", digests)
    plan = make_plan(np.full(n, 0.5), steps=2, noise_multiplier=1.0, secret_ids=[[0]] * n, rows=tagged)
    dataset = plan.attach(tagged)
    seen: set[str] = set()

    def collate(features):
        seen.update(*(f.keys() for f in features))
        return pad_collate(features)

    model = tiny_gpt2()
    forward = model.forward

    def checked_forward(**kwargs):
        seen.update(kwargs)
        return forward(**kwargs)

    model.forward = functools.wraps(forward)(checked_forward)  # keep the signature (position_ids)
    trainer = SecretProtectionTrainer(
        model=model,
        args=dp_config(tmp_path, remove_unused_columns=False),
        train_dataset=dataset,
        data_collator=collate,
        plan=plan,
    )
    trainer.train()
    assert "input_ids" in seen
    hidden = {"secret_ids", "hush_weight", "hush_sampling_prob", "secret_ids__hush_tagged_text__text"}
    assert not seen & hidden


def test_plain_trainer_with_attach_trains_exactly_like_secret_protection_trainer(tmp_path):
    n = 8
    plan = make_plan(np.full(n, 0.5), steps=3, noise_multiplier=0.8, rows=token_dataset(n))
    reference = build(tmp_path / "a", n, plan=plan, max_steps=3, dp_seed=SEED)
    reference.train()

    model = tiny_gpt2(seed=0)
    args = TrainingArguments(
        output_dir=str(tmp_path / "b"),
        max_steps=3,
        per_device_train_batch_size=4,
        max_grad_norm=0.0,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        dataloader_pin_memory=False,
    )
    dataset = plan.attach(token_dataset(n))
    trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=pad_collate)
    callback = GhostClippingCallback.attach(trainer, plan, clip_norm=1.0, dp_seed=SEED)
    assert callback in trainer.callback_handler.callbacks
    trainer.train()
    for name, value in parameters(model).items():
        torch.testing.assert_close(value, parameters(reference.model)[name], rtol=0, atol=0)
    assert all("grad_norm" not in log for log in trainer.state.log_history)
    assert trainer.state.log_history[0]["dp_noise_multiplier"] == 0.8


def test_attach_refuses_a_trainer_that_would_leak_or_miscount(tmp_path):
    plan = make_plan(np.full(8, 0.5), steps=2, noise_multiplier=1.0, rows=token_dataset(8))
    base = dict(output_dir=str(tmp_path), max_steps=2, report_to=[], use_cpu=True)
    cases = [
        ({}, "max_grad_norm must be 0, got 1.0"),
        (
            {"max_grad_norm": 0.0, "gradient_accumulation_steps": 2},
            "gradient_accumulation_steps must be 1, got 2",
        ),
        ({"max_grad_norm": 0.0, "max_steps": 5}, "max_steps=5 but the plan is calibrated for steps=2"),
    ]
    for overrides, match in cases:
        trainer = Trainer(
            model=tiny_gpt2(),
            args=TrainingArguments(**{**base, **overrides}),
            train_dataset=token_dataset(8),
            data_collator=pad_collate,
        )
        with pytest.raises(ValueError, match=match):
            GhostClippingCallback.attach(trainer, plan)
    # Added as a plain callback (no attach), training stops before any step.
    trainer = Trainer(
        model=tiny_gpt2(),
        args=TrainingArguments(**{**base, "max_grad_norm": 0.0}),
        train_dataset=token_dataset(8),
        data_collator=pad_collate,
        callbacks=[GhostClippingCallback(plan)],
    )
    with pytest.raises(RuntimeError, match="GhostClippingCallback"):
        trainer.train()


def test_model_with_an_unsupported_trainable_layer_is_refused_before_planning(tmp_path):
    class RenormalisingLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4, max_norm=1.0)  # rewrites its rows in place: refused

        def forward(self, input_ids=None, labels=None):
            raise AssertionError("never called")

    with pytest.raises(UnsupportedLayerError, match="'emb'.*max_norm"):
        build(tmp_path, model=RenormalisingLM(), plan="this plan is never loaded.json")


def test_plan_comes_from_exactly_one_of_secrets_file_plan_file_secrets_or_plan(tmp_path):
    (tmp_path / "secrets.csv").write_text("id,prior,target,terms\nalpha,1e-3,0.2,alpha\n")
    texts = ["alpha beta", "gamma", "alpha", "delta", "epsilon", "zeta", "eta", "theta"]
    dataset = token_dataset(8).add_column("text", texts)
    args = dict(max_steps=2, expected_batch_size=2.0)
    trainer = SecretProtectionTrainer(
        model=tiny_gpt2(),
        args=dp_config(tmp_path / "a", secrets_file=str(tmp_path / "secrets.csv"), **args),
        train_dataset=dataset,
        data_collator=pad_collate,
    )
    assert list(trainer.plan.secrets.num_examples) == [2] and trainer.plan.meets_targets
    assert trainer.train_dataset["secret_ids"] == [[0], [], [0], [], [], [], [], []]
    trainer.plan.save(tmp_path / "plan.json", include_fingerprint=True)  # local: keeps the row digests
    again = SecretProtectionTrainer(  # a saved plan trains the rows it was made from
        model=tiny_gpt2(),
        args=dp_config(tmp_path / "b", plan_file=str(tmp_path / "plan.json"), **args),
        train_dataset=trainer.train_dataset,
        data_collator=pad_collate,
    )
    assert np.array_equal(again.plan.sampling_probs, trainer.plan.sampling_probs)
    with pytest.raises(ValueError, match=r"exactly one of .* got \['plan', 'args.secrets_file'\]"):
        SecretProtectionTrainer(
            model=tiny_gpt2(),
            args=dp_config(tmp_path / "c", secrets_file=str(tmp_path / "secrets.csv"), **args),
            train_dataset=dataset,
            plan=trainer.plan,
        )
    with pytest.raises(ValueError, match="exactly one of .* got none"):
        SecretProtectionTrainer(
            model=tiny_gpt2(), args=dp_config(tmp_path / "d", **args), train_dataset=dataset
        )


def test_trainable_optimizer_parameter_outside_the_model_is_refused_before_any_step(tmp_path):
    """A parameter the per-example loss uses but the model does not own would get no clipping, no noise."""
    from hush_hf.trainer.losses import lm_per_example_loss

    class TemperatureTrainer(SecretProtectionTrainer):
        def compute_per_example_loss(self, model, inputs):
            return lm_per_example_loss(model, inputs) * self.temperature

    model, temperature = tiny_gpt2(), torch.nn.Parameter(torch.tensor(1.0))
    optimizer = torch.optim.SGD([{"params": list(model.parameters())}, {"params": [temperature]}], lr=1.0)
    plan = make_plan(np.full(8, 0.5), steps=2, noise_multiplier=1.0, rows=token_dataset(8))
    trainer = TemperatureTrainer(
        model=model,
        args=dp_config(tmp_path),
        train_dataset=plan.attach(token_dataset(8)),
        data_collator=pad_collate,
        plan=plan,
        optimizers=(optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)),
    )
    trainer.temperature = temperature
    before = parameters(model)
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]\[0\] \(shape \(\)\) is trainable"):
        trainer.train()
    assert temperature.item() == 1.0 and trainer.state.global_step == 0
    assert all(torch.equal(value, before[name]) for name, value in parameters(model).items())
    temperature.requires_grad_(False)  # frozen: nothing to protect, accepted
    trainer.train()
    assert trainer.state.global_step == 2


def test_plan_bound_to_no_rows_is_refused_with_any_dataset(tmp_path):
    from hush_hf.trainer.plan_setup import check_plan_fits

    n = 12
    secret_ids = [[i % 3] for i in range(n)]
    plan = make_plan(np.linspace(0.05, 0.6, n), steps=2, noise_multiplier=1.0, secret_ids=secret_ids)
    match = "the plan records no row digests, so train_dataset's rows cannot be matched"
    tagged = token_dataset(n).add_column("secret_ids", secret_ids)
    for dataset in (token_dataset(n), tagged):  # its secret_ids match the plan's, but not its content
        with pytest.raises(ValueError, match=match):
            build(tmp_path, n, plan=plan, dataset=dataset, attach=False)
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, max_grad_norm=0.0, report_to=[], use_cpu=True
    )
    plain = Trainer(model=tiny_gpt2(), args=args, train_dataset=tagged, data_collator=pad_collate)
    with pytest.raises(ValueError, match=match):
        GhostClippingCallback.attach(plain, plan)
    # Any map-style dataset of dict rows (not only datasets.Dataset) is matched by its content.
    rows = [{"input_ids": [3, 4 + i], "secret_ids": ids} for i, ids in enumerate(secret_ids)]
    bound = plan.bound_to(rows)
    check_plan_fits(bound, steps=2, dataset=rows)
    with pytest.raises(ValueError, match="differs from the rows the plan was made from at 12 of 12 rows"):
        check_plan_fits(bound, steps=2, dataset=rows[1:] + rows[:1])


def test_train_dataset_replaced_after_the_trainer_was_built_is_checked_again(tmp_path):
    n = 12
    secret_ids = [[i % 3] for i in range(n)]
    tagged = token_dataset(n).add_column("secret_ids", secret_ids)
    rho = np.linspace(0.05, 0.6, n)
    plan = make_plan(rho, steps=2, noise_multiplier=1.0, secret_ids=secret_ids, rows=tagged)
    trainer = build(tmp_path, n, plan=plan, dataset=tagged)
    trainer.train_dataset = tagged.select(range(1, n)).add_item(tagged[0])  # same rows, rotated
    with pytest.raises(ValueError, match="differs from the rows the plan was made from at 12 of 12 rows"):
        trainer.train()
    trainer.train_dataset = token_dataset(n, seed=1)
    with pytest.raises(ValueError, match="differs from the rows the plan was made from at 12 of 12 rows"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_logging_that_reads_the_pre_noise_step_is_refused_at_train_time_too(tmp_path, monkeypatch):
    trainer = build(tmp_path)
    trainer.args.include_num_input_tokens_seen = "non_padding"  # changed after the config was checked
    with pytest.raises(ValueError, match="include_num_input_tokens_seen='non_padding' is not supported"):
        trainer.train()
    trainer.args.include_num_input_tokens_seen = "no"
    trainer.args.report_to = ["wandb"]  # the WandbCallback was not added: only the check runs
    monkeypatch.setenv("WANDB_WATCH", "all")
    with pytest.raises(ValueError, match="WANDB_WATCH='all' with report_to=\\['wandb'\\] is not supported"):
        trainer.train()
    assert trainer.state.global_step == 0
