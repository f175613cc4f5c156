"""The publication chain a review found untrue (third batch): what the card and ``hush verify`` certify."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import TrainerCallback

from hush_hf.cli import main as hush
from hush_hf.trainer import SecretProtectionTrainer
from tests.test_publishing import commits  # noqa: F401  (fixture: HfApi mocked, nothing leaves the machine)
from tests.test_trainer import build
from tests.test_trainer_helpers import (  # noqa: F401  (single_thread: autouse fixture)
    dp_config,
    make_plan,
    pad_collate,
    single_thread,
    tiny_gpt2,
    token_dataset,
)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")

CHANGED = r"^{what}: the model's weights changed after DP training ended \(state_dict entry '[^']+' {how}\)"


# ----------------------------------------------------------------------------- weights changed after training
def _load_other_weights(model):
    model.load_state_dict(tiny_gpt2(seed=5).state_dict())


def _plain_step(model):  # a few "quick" non-DP steps on the private rows
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.tensor(token_dataset(4)["input_ids"][0]).unsqueeze(0)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()


def _through_data(model):  # .data leaves the version counter alone
    model.transformer.h[0].mlp.c_fc.weight.data.add_(1e-3)


def _resize_embeddings(model):
    model.resize_token_embeddings(80)


CHANGES = {
    "load_state_dict": (_load_other_weights, "was written in place"),
    "plain optimizer step": (_plain_step, "was written in place"),
    "write through .data": (_through_data, "holds other values"),
    "resize_token_embeddings": (_resize_embeddings, "changed shape or dtype"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_weights_changed_after_training_are_never_certified(tmp_path, change):
    # The certificate hashes the files save_model writes, so any weights saved after training got the card,
    # the run's sigma and steps, and passed `hush verify`: another model loaded with load_state_dict did too.
    edit, how = CHANGES[change]
    trainer = build(tmp_path)
    trainer.train()
    edit(trainer.model)
    with pytest.raises(ValueError, match=CHANGED.format(what="save_model", how=how)):
        trainer.save_model()
    with pytest.raises(ValueError, match=CHANGED.format(what="push_to_hub", how=how)):
        trainer.push_to_hub()  # refused before any repository is created or any file written
    assert not (tmp_path / "hush_plan.json").exists() and not (tmp_path / "model.safetensors").exists()


class EditAtTrainEnd(TrainerCallback):
    def on_train_end(self, args, state, control, model=None, **kwargs):
        with torch.no_grad():
            model.lm_head.weight.mul_(1.5)  # tied with the embeddings: 'transformer.wte.weight'


def test_a_callback_editing_the_weights_at_train_end_is_refused(tmp_path):
    trainer = build(tmp_path)
    trainer.add_callback(EditAtTrainEnd())  # after the DP callback: it runs once the run has ended
    trainer.train()
    with pytest.raises(ValueError, match=CHANGED.format(what="save_model", how="was written in place")):
        trainer.save_model()


def test_a_run_that_raised_remembers_the_weights_it_left(tmp_path):
    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise KeyboardInterrupt

    trainer = build(tmp_path)
    trainer.add_callback(Stop())
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert trainer.state.global_step == 1
    _through_data(trainer.model)
    with pytest.raises(ValueError, match=CHANGED.format(what="save_model", how="holds other values")):
        trainer.save_model()


def test_weights_as_training_left_them_still_save_and_verify(tmp_path, capsys):
    # Evaluating, saving twice and moving the model (same values summed again) change nothing.
    trainer = build(tmp_path, eval_dataset=token_dataset(4, seed=3))
    trainer.train()
    trainer.evaluate()
    trainer.save_model()
    trainer.model.to("cpu")
    trainer.save_model()
    assert hush(["verify", str(tmp_path), "--as-pushed"]) == 0


def test_a_merged_lora_adapter_is_refused(tmp_path):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_gpt2(), LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True))
    plan = make_plan(np.full(8, 0.5), steps=2, noise_multiplier=1.0, rows=token_dataset(8))
    trainer = SecretProtectionTrainer(model=model, args=dp_config(tmp_path), data_collator=pad_collate,
                                      train_dataset=plan.attach(token_dataset(8)), plan=plan)
    trainer.train()
    trainer.model.merge_and_unload()  # the trainer's PeftModel loses its adapters: an empty adapter was saved
    with pytest.raises(ValueError, match=CHANGED.format(what="save_model", how="was removed")):
        trainer.save_model()


# ----------------------------------------------------------------------------- weight files no save wrote
def lora_trainer(tmp_path):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_gpt2(), LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True))
    plan = make_plan(np.full(8, 0.5), steps=2, noise_multiplier=1.0, rows=token_dataset(8))
    return SecretProtectionTrainer(model=model, args=dp_config(tmp_path), data_collator=pad_collate,
                                   train_dataset=plan.attach(token_dataset(8)), plan=plan)


STALE = r"^output_dir '.*' holds the weight file '{name}', which this save did not write \(an earlier save"


def test_an_earlier_runs_weights_left_in_output_dir_are_never_certified(tmp_path, commits):  # noqa: F811
    # A non-DP baseline saved to the same folder: the LoRA run's record hashed its model.safetensors beside
    # the adapter, the card certified both, push_to_hub uploaded both, and `hush verify` said OK.
    tiny_gpt2(seed=9).save_pretrained(tmp_path)
    trainer = lora_trainer(tmp_path)
    trainer.train()
    with pytest.raises(ValueError, match=STALE.format(name="model.safetensors")):
        trainer.save_model()
    assert not (tmp_path / "hush_plan.json").exists()
    with pytest.raises(ValueError, match=STALE.format(name="model.safetensors")):
        trainer.push_to_hub()
    assert commits == []
    (tmp_path / "model.safetensors").unlink()
    trainer.save_model()
    weights = json.loads((tmp_path / "hush_plan.json").read_text())["training"]["weights"]
    assert set(weights) == {"adapter_model.safetensors"}
    assert hush(["verify", str(tmp_path), "--as-pushed"]) == 0


def test_an_earlier_adapter_beside_a_full_save_is_never_certified(tmp_path):
    earlier = lora_trainer(tmp_path / "earlier")
    earlier.model.save_pretrained(tmp_path / "run")
    trainer = build(tmp_path / "run")
    trainer.train()
    with pytest.raises(ValueError, match=STALE.format(name="adapter_model.safetensors")):
        trainer.save_model()


# ----------------------------------------------------------------------------- secrets in the tokenizer
def secret_trainer(tmp_path, tokenizer):
    import datasets
    from transformers import DataCollatorForLanguageModeling

    (tmp_path / "secrets.csv").write_text("id,prior,target,terms\ns0,1e-3,0.2,nightjar\n")
    texts = ["the code name is nightjar", "lunch is soup", "the lab is closed", "the sky is blue"] * 2
    rows = datasets.Dataset.from_dict({"text": texts, **tokenizer(texts)})
    return SecretProtectionTrainer(
        model=tiny_gpt2(vocab=len(tokenizer)),
        args=dp_config(tmp_path / "out", secrets_file=str(tmp_path / "secrets.csv"), max_steps=2,
                       expected_batch_size=2.0),
        train_dataset=rows, data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        processing_class=tokenizer,
    )


def test_a_tokenizer_whose_added_tokens_spell_a_secret_is_never_published(tmp_path, commits):  # noqa: F811
    # Tokens added from the private corpus (a code name made one token) were saved and pushed in
    # tokenizer.json verbatim, beside a card saying no secret's content is published in the repository.
    from hush_hf.assets.tokenizer_assets import gpt2_tokenizer

    tokenizer = gpt2_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.add_tokens(["<sep>", " NightJar"])
    trainer = secret_trainer(tmp_path, tokenizer)
    trainer.train()
    refused = (r"^save_model: the tokenizer's added token id 50258 holds protected secret 0, and the "
               r"tokenizer files saved beside the weights would publish it verbatim")
    with pytest.raises(ValueError, match=refused) as error:
        trainer.save_model()
    assert "ightjar" not in str(error.value).lower()
    with pytest.raises(ValueError, match=refused.replace("save_model", "push_to_hub")):
        trainer.push_to_hub()
    assert commits == [] and not (tmp_path / "out" / "tokenizer.json").exists()


def test_added_tokens_holding_no_secret_are_published(tmp_path):
    from hush_hf.assets.tokenizer_assets import gpt2_tokenizer

    tokenizer = gpt2_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.add_tokens(["<sep>", "night", "jars"])  # parts of other words are not the secret
    trainer = secret_trainer(tmp_path, tokenizer)
    trainer.train()
    trainer.save_model()
    assert '"<sep>"' in (tmp_path / "out" / "tokenizer.json").read_text()
    assert hush(["verify", str(tmp_path / "out"), "--as-pushed"]) == 0


# ----------------------------------------------------------------------------- writes between DP steps
class NudgeAtStepEnd(TrainerCallback):
    """A callback that moves the weights outside the DP step (a plain update, an average) at ``step``."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                model.transformer.h[0].attn.c_attn.weight.add_(1e-3)


WRITTEN = (r"^{what}trainable parameter 'transformer\.h\.0\.attn\.c_attn\.weight' was written in place after "
           r"DP step {step} and before the next \(by a callback, outside the DP step\)")


def test_a_write_between_dp_steps_stops_the_run_and_is_never_published(tmp_path):
    # A callback's update between steps went into the weights with no clipping or noise; the card still
    # stated the run's sigma and 2 DP steps, and `hush verify` agreed.
    trainer = build(tmp_path)
    trainer.add_callback(NudgeAtStepEnd(1))
    with pytest.raises(ValueError, match=WRITTEN.format(what="", step=1)):
        trainer.train()
    assert trainer.state.global_step == 1
    with pytest.raises(ValueError, match=WRITTEN.format(what="save_model: ", step=1)):
        trainer.save_model()


def test_a_write_after_the_last_dp_step_is_never_published(tmp_path):
    trainer = build(tmp_path)
    trainer.add_callback(NudgeAtStepEnd(2))  # after the last step: training ends without an error
    trainer.train()
    with pytest.raises(ValueError, match=WRITTEN.format(what="save_model: ", step=2)):
        trainer.save_model()
    assert not (tmp_path / "hush_plan.json").exists()


# ----------------------------------------------------------------------------- cards written without a save
UNSAVED = (r"^create_model_card: output_dir '.*' holds the weight file 'model\.safetensors', which no "
           r"save_model or push_to_hub of this trainer wrote")


def test_a_card_beside_weights_no_save_of_the_trainer_wrote_is_refused(tmp_path, capsys):
    # create_model_card hashed whatever weight file output_dir held: an earlier run's model got this
    # run's card.
    tiny_gpt2(seed=9).save_pretrained(tmp_path)
    trainer = build(tmp_path)
    trainer.train()
    with pytest.raises(ValueError, match=UNSAVED):
        trainer.create_model_card()
    assert not (tmp_path / "hush_plan.json").exists()
    (tmp_path / "model.safetensors").unlink()
    trainer.save_model()
    trainer.create_model_card()  # beside the weights its own save wrote: certified as before
    assert hush(["verify", str(tmp_path), "--as-pushed"]) == 0, capsys.readouterr().out


def test_trl_checkpoints_never_certify_an_earlier_runs_weights(tmp_path):
    from hush_hf.trainer import GhostClippingCallback
    from tests.test_trl import sft_trainer

    trainer = sft_trainer(tmp_path, save_strategy="steps", save_steps=1)
    tiny_gpt2(seed=9).save_pretrained(tmp_path)  # SFTTrainer writes its card there at each checkpoint
    plan = make_plan(np.ones(len(trainer.train_dataset)), steps=1, noise_multiplier=1.0,
                     rows=trainer.train_dataset)
    trainer.train_dataset = plan.attach(trainer.train_dataset)
    GhostClippingCallback.attach(trainer, plan, clip_norm=1.0, dp_seed=3)
    with pytest.raises(ValueError, match=UNSAVED):
        trainer.train()
    assert not (tmp_path / "hush_plan.json").exists()


def test_a_plain_trainer_given_attach_refuses_changed_weights_too(tmp_path):
    from tests.test_publishing import attached

    trainer = attached(tmp_path)
    trainer.train()
    _load_other_weights(trainer.model)
    with pytest.raises(ValueError, match=CHANGED.format(what="save_model", how="was written in place")):
        trainer.save_model()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64, torch.int64, torch.bool])
def test_bit_sums_are_the_exact_sums_of_the_words_in_any_chunking(monkeypatch, dtype):
    from hush_hf.trainer import trained_weights

    monkeypatch.setattr(trained_weights, "_CHUNK", 7)  # several chunks and a short last one
    values = torch.randn(10, 5, generator=torch.Generator().manual_seed(0))
    values = values > 0 if dtype == torch.bool else (values * 1e3).to(dtype)
    raw = values.numpy().tobytes() if dtype != torch.bfloat16 else values.view(torch.int16).numpy().tobytes()
    width = {1: np.int8, 2: np.int16}.get(values.element_size(), np.int32)
    words = [int(w) for w in np.frombuffer(raw, dtype=width)]  # Python integers: no overflow, any order
    expected = (sum(words), sum(w * (i % 251 + 1) for i, w in enumerate(words)))
    assert trained_weights.bit_sums(values) == expected
    assert trained_weights.bit_sums(values.t()) != expected  # the same values elsewhere: a move is seen


def test_a_one_element_write_through_data_is_seen_however_small():
    from hush_hf.trainer.trained_weights import TrainedWeights

    layer = torch.nn.Linear(300, 300)
    left = TrainedWeights.of(layer)
    assert left.first_change(layer) is None
    layer.weight.data[3, 4] += 1e-6  # one element, an lr-sized step, through .data
    assert layer.weight._version == left.marks["weight"].version
    assert left.first_change(layer) == "'weight' holds other values"
