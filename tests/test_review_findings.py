"""Settings a user's script can toggle that would break the guarantee without an error (review findings)."""

from __future__ import annotations

import pytest
import torch

from tests.test_trainer import build
from tests.test_trainer_helpers import single_thread, tiny_gpt2  # noqa: F401  (autouse fixture)


def test_neftune_noise_scales_with_the_other_rows_so_it_is_refused(tmp_path):
    # NEFTune's embedding noise is U(-a, a) with a = alpha / sqrt(L d), L the batch's padded width: a short
    # row's noise shrinks when a long row is drawn with it, so its gradient depends on the other rows.
    from transformers.integrations.neftune import activate_neftune, deactivate_neftune

    model = tiny_gpt2().train()
    handle = activate_neftune(model, 5.0)
    embed = model.get_input_embeddings()
    short = torch.full((1, 4), 7)
    with torch.no_grad():
        alone = (embed(short) - torch.nn.functional.embedding(short, embed.weight)).abs().max()
        batch = torch.full((2, 64), 7)
        beside_long = (embed(batch) - torch.nn.functional.embedding(batch, embed.weight))[0, :4].abs().max()
    deactivate_neftune(model, handle)
    d = embed.weight.shape[1]
    assert alone > 5.0 / (64 * d) ** 0.5 >= beside_long  # the bound a of a 64-wide batch, below the row's own

    with pytest.raises(ValueError, match=r"neftune_noise_alpha=5\.0 is not supported"):
        build(tmp_path, neftune_noise_alpha=5.0).train()


def test_a_second_run_on_weights_another_run_trained_is_refused(tmp_path):
    # A new trainer on the same model object (a notebook re-run after a crash or to retry a learning rate)
    # would certify only its own T steps, while the weights went through both runs' 2T.
    model = tiny_gpt2()
    build(tmp_path / "first", model=model, max_steps=2).train()
    second = build(tmp_path / "second", model=model, max_steps=2, dp_seed=99)
    with pytest.raises(ValueError, match=r"already went through 2 optimizer step\(s\) of another DP run"):
        second.train()
    fresh = build(tmp_path / "fresh", model=tiny_gpt2(), max_steps=2, dp_seed=99)
    fresh.train()
    assert fresh.state.global_step == 2


def test_weights_loaded_from_a_dp_runs_folder_are_warned_about(tmp_path):
    # Saved by a DP run and loaded again, the weights are new tensors the in-process check cannot see:
    # training them again on the same secrets would compose the two runs' bounds, and neither card says so.
    import warnings

    from transformers import GPT2LMHeadModel

    first = build(tmp_path / "first", model=tiny_gpt2(), max_steps=2)
    first.train()
    first.save_model()
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path / "first")
    second = build(tmp_path / "second", model=loaded, max_steps=2, dp_seed=99)
    warned = (r"^the model was loaded from '.*first', whose hush_plan\.json records 2 DP step\(s\) of an "
              r"earlier run: this run's card counts only")
    with pytest.warns(UserWarning, match=warned):
        second.train()
    assert second.state.global_step == 2
    plain = build(tmp_path / "plain", model=tiny_gpt2(), max_steps=1, dp_seed=99)
    plain.model.save_pretrained(tmp_path / "no_plan")  # weights no DP run saved: nothing to say
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="the model was loaded from")
        build(tmp_path / "third", model=GPT2LMHeadModel.from_pretrained(tmp_path / "no_plan"), max_steps=1,
              dp_seed=99).train()


SELECTIONS = {
    "load_best_model_at_end": dict(load_best_model_at_end=True, save_strategy="steps", save_steps=1),
    "reduce_lr_on_plateau": dict(lr_scheduler_type="reduce_lr_on_plateau"),
    "early_stopping": dict(load_best_model_at_end=False),
}


@pytest.mark.parametrize("selection", sorted(SELECTIONS))
def test_metrics_on_rows_with_secrets_may_not_choose_the_weights(tmp_path, selection):
    # The card certifies the weights; if eval loss on rows holding a secret (no noise) picks the checkpoint,
    # sets the learning rate or stops the run, the weights are a function of those rows outside the plan.
    from transformers import EarlyStoppingCallback

    from hush_hf.trainer import SecretProtectionTrainer
    from tests.test_trainer_helpers import dp_config, pad_collate, token_dataset

    (tmp_path / "secrets.csv").write_text("id,prior,target,terms\ns0,1e-3,0.2,alpha\n")
    train = token_dataset(8).add_column("text", ["alpha beta", "gamma", "alpha", "delta", "x", "y", "z", "w"])

    def trainer(eval_texts, folder):
        return SecretProtectionTrainer(
            model=tiny_gpt2(),
            args=dp_config(tmp_path / folder, secrets_file=str(tmp_path / "secrets.csv"), max_steps=2,
                           expected_batch_size=2.0, eval_strategy="steps", eval_steps=1,
                           metric_for_best_model="loss", **SELECTIONS[selection]),
            train_dataset=train,
            eval_dataset=token_dataset(2, seed=5).add_column("text", eval_texts),
            data_collator=pad_collate,
            callbacks=[EarlyStoppingCallback(3)] if selection == "early_stopping" else None,
        )

    with pytest.warns(UserWarning, match="1 of 2 rows hold protected secrets"):
        leaky = trainer(["the Alpha run", "gamma"], "leaky")
    with pytest.raises(ValueError, match="lets evaluation metrics choose the trained weights, but eval "
                                         "dataset 'eval' has 1 rows holding protected secrets"):
        leaky.train()
    clean = trainer(["the beta run", "gamma"], "clean")
    clean.train()
    assert clean.state.global_step == 2


def test_tokens_made_from_other_text_than_the_tagged_column_are_refused(tmp_path):
    # A tokenized dataset that kept a prompt-only 'text' column beside tokens of prompt + completion: tagging
    # 'text' misses the secret in row 1's completion, which the model trains on.
    import datasets
    from transformers import DataCollatorForLanguageModeling

    from hush_hf.assets.tokenizer_assets import gpt2_tokenizer
    from hush_hf.trainer import SecretProtectionTrainer
    from tests.test_trainer_helpers import dp_config

    tokenizer = gpt2_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    (tmp_path / "secrets.csv").write_text("id,prior,target,terms\ns0,1e-3,0.2,nightjar\n")
    prompts = ["the code name is nightjar", "the code name is", "lunch is", "the lab is"] * 2
    completions = [" fine", " nightjar", " soup", " closed"] * 2

    def trainer(texts, folder):
        encoded = tokenizer([p + c for p, c in zip(prompts, completions, strict=True)])
        rows = datasets.Dataset.from_dict({"text": texts, **encoded})
        return SecretProtectionTrainer(
            model=tiny_gpt2(vocab=len(tokenizer)),
            args=dp_config(tmp_path / folder, secrets_file=str(tmp_path / "secrets.csv"), max_steps=2,
                           expected_batch_size=2.0),
            train_dataset=rows, data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
            processing_class=tokenizer,
        )

    with pytest.raises(ValueError, match="row 0: its input_ids spell text that its 'text' column does not"):
        trainer(prompts, "prompts")
    # The same with ids tagged beforehand (tag_dataset on the prompts), then tokens of prompt + completion.
    from hush_hf.secrets import SecretSet, tag_dataset, tagger_for

    secrets = SecretSet.load(tmp_path / "secrets.csv")
    tagged = tag_dataset(datasets.Dataset.from_dict({"text": prompts}), tagger_for(secrets),
                         text_column="text", num_secrets=1)
    encoded = tokenizer([p + c for p, c in zip(prompts, completions, strict=True)])
    for key, values in encoded.items():
        tagged = tagged.add_column(key, values)
    with pytest.raises(ValueError, match="row 0: its input_ids spell text that its 'text' column does not"):
        SecretProtectionTrainer(
            model=tiny_gpt2(vocab=len(tokenizer)),
            args=dp_config(tmp_path / "tagged", secrets_file=str(tmp_path / "secrets.csv"), max_steps=2,
                           expected_batch_size=2.0),
            train_dataset=tagged, data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
            processing_class=tokenizer,
        )
    whole = trainer([p + c for p, c in zip(prompts, completions, strict=True)], "whole")
    assert [bool(ids) for ids in whole.train_dataset["secret_ids"]] == [True, True, False, False] * 2


def test_the_spelling_check_passes_special_tokens_truncation_and_normalisation():
    from hush_hf.assets.tokenizer_assets import bert_uncased_tokenizer, gpt2_tokenizer
    from hush_hf.trainer.text_tokens import first_row_not_spelled

    texts = ["Café Ünïcode, naïve résumé: ProjectFalcon's 7,741 items!", "  spaces\n\tand tabs ",
             "emoji 🦜 and 中文 mixed", "ﬁ ligature ＦＵＬＬ width " * 20]
    for tokenizer in (bert_uncased_tokenizer(), gpt2_tokenizer()):
        for encoded in (tokenizer(texts), tokenizer(texts, truncation=True, max_length=9)):
            assert first_row_not_spelled(texts, encoded["input_ids"], tokenizer) is None
        extra = tokenizer([t + " nightjar" for t in texts])["input_ids"]
        assert first_row_not_spelled(texts, extra, tokenizer) == 0


def test_an_eval_dataset_set_after_construction_is_counted_for_the_card(tmp_path):
    # Counted at construction only, a clean eval set later replaced by rows holding a secret left the card
    # silent about evaluations on them.
    from hush_hf.trainer import SecretProtectionTrainer
    from tests.test_trainer_helpers import dp_config, pad_collate, token_dataset

    (tmp_path / "secrets.csv").write_text("id,prior,target,terms\ns0,1e-3,0.2,alpha\n")
    train = token_dataset(8).add_column("text", ["alpha beta", "gamma", "alpha", "delta", "x", "y", "z", "w"])
    trainer = SecretProtectionTrainer(
        model=tiny_gpt2(),
        args=dp_config(tmp_path / "out", secrets_file=str(tmp_path / "secrets.csv"), max_steps=2,
                       expected_batch_size=2.0, eval_strategy="steps", eval_steps=1),
        train_dataset=train,
        eval_dataset=token_dataset(2, seed=5).add_column("text", ["the beta run", "gamma"]),
        data_collator=pad_collate,
    )
    trainer.eval_dataset = token_dataset(2, seed=6).add_column("text", ["the Alpha run", "gamma"])
    with pytest.warns(UserWarning, match="1 of 2 rows hold protected secrets"):
        trainer.train()
    trainer.save_model()
    card = (tmp_path / "out" / "README.md").read_text()
    assert "The evaluations run during training (eval) included 1 rows that hold protected secrets." in card


@pytest.mark.parametrize("axis", ["tp", "cp", "sp"])
def test_tensor_context_and_sequence_parallelism_are_refused(tmp_path, axis):
    # The DP step gives each rank its own share of the drawn rows; tensor parallelism combines partial
    # results across ranks that should hold the same rows (examples mixed), context/sequence parallelism
    # splits one example's tokens over ranks (no rank clips a whole example's gradient).
    from accelerate import ParallelismConfig

    from hush_hf.trainer.validation import check_dp_training_arguments
    from tests.test_trainer_helpers import dp_config

    args = dp_config(tmp_path, max_grad_norm=0.0)
    args.parallelism_config = ParallelismConfig(**{f"{axis}_size": 2})
    with pytest.raises(ValueError, match=rf"parallelism_config\.{axis}_size=2 is not supported"):
        check_dp_training_arguments(args)


def test_a_tensor_parallel_model_is_refused():
    from types import SimpleNamespace

    from hush_hf.trainer.validation import check_model_not_tensor_parallel

    check_model_not_tensor_parallel(tiny_gpt2())  # tp_size None: not sharded
    with pytest.raises(ValueError, match=r"the model is tensor-parallel \(tp_size=2"):
        check_model_not_tensor_parallel(SimpleNamespace(tp_size=2))  # from_pretrained(tp_plan=...) on 2 ranks


def test_a_step_stopped_by_an_error_inside_the_optimizer_is_counted(tmp_path):
    # The optimizer updated the weights with the second noised gradient, then raised: Trainer's global_step
    # stays at 1, but the weights went through 2 DP steps, and a save after the error must say 2.
    import json

    class FailingSGD(torch.optim.SGD):
        calls = 0

        def step(self, closure=None):
            super().step(closure)
            FailingSGD.calls += 1
            if FailingSGD.calls == 2:
                raise RuntimeError("optimizer failed after updating")

    model = tiny_gpt2()
    optimizer = FailingSGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    trainer = build(tmp_path, model=model, max_steps=3)
    trainer.optimizer, trainer.lr_scheduler = optimizer, schedule
    with pytest.raises(RuntimeError, match="optimizer failed after updating"):
        trainer.train()
    assert trainer.state.global_step == 1
    trainer.save_model()
    record = json.loads((tmp_path / "hush_plan.json").read_text())["training"]
    assert record["dp_steps"] == 2


def test_epochs_without_max_steps_are_refused_naming_max_steps(tmp_path):
    # Planning ran first and failed with "steps must be an integer >= 1, got -1", naming no setting.
    from hush_hf.trainer import SecretProtectionTrainer
    from tests.test_trainer_helpers import dp_config, pad_collate, token_dataset

    (tmp_path / "secrets.csv").write_text("id,prior,target,terms\ns0,1e-3,0.2,alpha\n")
    train = token_dataset(8).add_column("text", ["alpha beta", "gamma", "alpha", "delta", "x", "y", "z", "w"])
    with pytest.raises(ValueError, match=r"max_steps must be an integer >= 1 .* got -1; num_train_epochs"):
        SecretProtectionTrainer(
            model=tiny_gpt2(),
            args=dp_config(tmp_path / "out", secrets_file=str(tmp_path / "secrets.csv"), max_steps=-1,
                           num_train_epochs=3, expected_batch_size=2.0),
            train_dataset=train, data_collator=pad_collate,
        )


def test_eval_rows_whose_tokens_are_not_their_text_count_as_unchecked(tmp_path):
    # Counting eval rows by tagging a prompt-only 'text' beside tokens of prompt + completion missed the
    # secret in the completion: the card said nothing, and a best checkpoint could be chosen by that loss.
    import datasets

    from hush_hf.assets.tokenizer_assets import gpt2_tokenizer
    from hush_hf.trainer.evaluation import secret_rows

    tokenizer = gpt2_tokenizer()
    (tmp_path / "secrets.csv").write_text("id,prior,target,terms\ns0,1e-3,0.2,nightjar\n")
    prompts, completions = ["the code name is", "lunch is"], [" nightjar", " soup"]
    tokens = tokenizer([p + c for p, c in zip(prompts, completions, strict=True)])
    rows = datasets.Dataset.from_dict({"text": prompts, **tokens})
    secrets = str(tmp_path / "secrets.csv")
    assert secret_rows(rows, secrets=secrets) == 0  # trusted without a tokenizer: the miss
    assert secret_rows(rows, secrets=secrets, tokenizer=tokenizer) is None
    joined = [p + c for p, c in zip(prompts, completions, strict=True)]
    whole = rows.remove_columns("text").add_column("text", joined)
    assert secret_rows(whole, secrets=secrets, tokenizer=tokenizer) == 1


def test_a_secret_only_in_a_seq2seq_target_marks_its_row(tmp_path):
    # tokenizer(inputs, text_target=targets): the decoder trains on the targets (labels), but the marks
    # followed the inputs only, so a secret in an answer alone left its row unmarked.
    from hush_hf import mark_secrets
    from hush_hf.assets.tokenizer_assets import gpt2_tokenizer
    from hush_hf.secrets import SecretSet
    from hush_hf.secrets.marks import find_marks_column, secret_ids_from_marks

    (tmp_path / "s.csv").write_text("id,prior,target,terms\ns0,1e-3,0.2,nightjar\ns1,1e-3,0.2,falcon\n")
    marking = mark_secrets(gpt2_tokenizer(), SecretSet.load(tmp_path / "s.csv"))
    inputs = ["what is the code name?", "where is lunch?", "falcon or not?"]
    encoded = marking(inputs, text_target=["it is nightjar", "the cafe", "nightjar"])
    column = find_marks_column(list(encoded.keys()))
    assert secret_ids_from_marks(encoded[column]).to_pylist() == [[0], [], [0, 1]]
    assert all(marks == [0] for marks in encoded[column][0])  # every token: any cut keeps the row marked
    single = marking(inputs[1], text_target="nightjar")
    assert all(marks == [0] for marks in single[column])
    windows = marking([inputs[1] * 4], text_target=["a falcon"], truncation=True, max_length=4,
                      return_overflowing_tokens=True, stride=1)
    assert len(windows["input_ids"]) > 1
    assert secret_ids_from_marks(windows[column]).to_pylist() == [[1]] * len(windows["input_ids"])
    with pytest.raises(ValueError, match="called with text_target alone"):
        marking(text_target=["it is nightjar"])


def test_seq2seq_labels_made_from_a_target_beside_a_source_only_text_column_are_refused(tmp_path):
    import datasets

    from hush_hf.assets.tokenizer_assets import gpt2_tokenizer
    from hush_hf.trainer.text_tokens import check_tokens_spell_text

    tokenizer = gpt2_tokenizer()
    sources, targets = ["what is the code name?", "where is lunch?"], ["it is nightjar", "the cafe"]
    encoded = tokenizer(sources, text_target=targets)
    rows = datasets.Dataset.from_dict({"text": sources, **encoded})
    with pytest.raises(ValueError, match="row 0: its labels spell text that its 'text' column does not hold"):
        check_tokens_spell_text(rows, tokenizer, text_column="text", name="train_dataset")
    causal = datasets.Dataset.from_dict({"text": sources, "input_ids": encoded["input_ids"],
                                         "labels": [[-100] + ids[1:] for ids in encoded["input_ids"]]})
    check_tokens_spell_text(causal, tokenizer, text_column="text", name="train_dataset")
