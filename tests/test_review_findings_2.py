"""Silent or confusing failures of SecretProtectionTrainer a review found (second batch)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.test_trainer import build
from tests.test_trainer_helpers import (  # noqa: F401  (single_thread: autouse fixture)
    parameters,
    single_thread,
    tiny_bert,
    tiny_gemma2,
    tiny_gpt2,
)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given")


# ----------------------------------------------------------------------------- buffers the forward writes
class RunningMean(nn.Module):
    """A LayerNorm that keeps a running mean of its inputs in a buffer, written the way ``mode`` says."""

    def __init__(self, inner: nn.LayerNorm, mode: str) -> None:
        super().__init__()
        self.inner, self.mode = inner, mode
        self.register_buffer("running_mean", torch.zeros(inner.normalized_shape[0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and (self.mode != "with_grad_only" or torch.is_grad_enabled()):
            mean = x.detach().mean((0, 1))
            if self.mode in ("in_place", "with_grad_only"):
                self.running_mean.mul_(0.9).add_(0.1 * mean)
            elif self.mode == "through_data":  # .data: the buffer's version counter does not move
                self.running_mean.data.copy_(0.9 * self.running_mean.data + 0.1 * mean)
            else:  # "replaced": a new tensor assigned to the buffer's name
                self.running_mean = 0.9 * self.running_mean + 0.1 * mean
        return self.inner(x)


@pytest.mark.parametrize("mode", ["in_place", "through_data", "replaced", "with_grad_only"])
def test_a_buffer_the_training_forward_writes_is_refused_before_any_optimizer_step(tmp_path, mode):
    # The running mean is a statistic of the drawn rows, neither clipped nor noised, and state_dict saves it
    # with the weights: it trained (and would have been published) without an error before.
    model = tiny_gpt2()
    model.transformer.ln_f = RunningMean(model.transformer.ln_f, mode)
    before = parameters(model)
    trainer = build(tmp_path, model=model)
    with pytest.raises(ValueError, match=r"^layer 'transformer\.ln_f' \(RunningMean\) writes its buffer "
                                         r"'running_mean' in the training forward: .*GroupNorm or LayerNorm"):
        trainer.train()
    assert trainer.state.global_step == 0
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    if mode != "with_grad_only":  # refused by the first step's check, which puts the buffers back
        assert torch.equal(model.transformer.ln_f.running_mean, torch.zeros(16))


@pytest.mark.parametrize("make", [tiny_gpt2, tiny_bert, tiny_gemma2], ids=lambda f: f.__name__)
def test_models_whose_buffers_no_forward_writes_still_train(tmp_path, make):
    # BERT's position_ids and token_type_ids, Gemma-2's rotary inv_freq (GPT-2 registers no buffer in
    # transformers 5): read by the forward, never written, so they pass and stay as they were.
    model = make()
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    assert make is tiny_gpt2 or buffers
    trainer = build(tmp_path, model=model)
    trainer.train()
    assert trainer.state.global_step == 2
    assert all(torch.equal(b, buffers[name]) for name, b in model.named_buffers())


# ----------------------------------------------------------------------------- methods the DP step never runs
def test_an_overridden_compute_loss_is_refused_when_the_trainer_is_built(tmp_path):
    # The DP step computes its own per-example loss: a subclass's compute_loss (a weighted loss, an auxiliary
    # term) was never called, and the run trained the default loss without a word.
    from transformers import Trainer

    from hush_hf.trainer import GhostClippingCallback, SecretProtectionTrainer
    from tests.test_trainer_helpers import dp_config, make_plan, pad_collate, token_dataset

    calls = []

    class WeightedLoss(SecretProtectionTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            calls.append(1)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    with pytest.raises(ValueError, match=r"^WeightedLoss\.compute_loss overrides Trainer\.compute_loss "
                                         r"\(WeightedLoss\): not supported with DP training: the loss "
                                         r"must be per example .*override compute_per_example_loss"):
        WeightedLoss(model=tiny_gpt2(), args=dp_config(tmp_path), train_dataset=token_dataset(8),
                     plan=tmp_path / "never_read.json")  # refused before the plan is even loaded

    class PlainWeightedLoss(Trainer):
        compute_loss = WeightedLoss.compute_loss

    rows = token_dataset(8)
    plan = make_plan([0.5] * 8, steps=2, noise_multiplier=1.0, rows=rows)
    plain = PlainWeightedLoss(model=tiny_gpt2(), args=dp_config(tmp_path / "plain"),
                              train_dataset=plan.attach(rows), data_collator=pad_collate)
    with pytest.raises(ValueError, match=r"^PlainWeightedLoss\.compute_loss overrides Trainer\.compute_loss"):
        GhostClippingCallback.attach(plain, plan)
    plain.compute_loss = lambda *args, **kwargs: None  # a loss set on the instance is not called either
    with pytest.raises(ValueError, match=r"^PlainWeightedLoss\.compute_loss is set on the instance"):
        GhostClippingCallback.attach(plain, plan)
    assert calls == []

    class OwnPerExampleLoss(SecretProtectionTrainer):  # the supported way: still trains
        def compute_per_example_loss(self, model, inputs):
            return 2.0 * super().compute_per_example_loss(model, inputs)

    own = OwnPerExampleLoss(model=tiny_gpt2(), args=dp_config(tmp_path / "own"),
                            train_dataset=plan.attach(rows), data_collator=pad_collate, plan=plan)
    own.train()
    assert own.state.global_step == 2


def test_an_overridden_get_train_dataloader_is_refused_when_the_trainer_is_built(tmp_path):
    # The DP trainer draws its own Poisson batches; a subclass's loader failed inside train() with "the DP
    # data loader is built inside train(); call trainer.train()", which says nothing of the override.
    from torch.utils.data import DataLoader
    from transformers import Trainer

    from hush_hf.trainer import GhostClippingCallback, SecretProtectionTrainer
    from tests.test_trainer_helpers import dp_config, make_plan, pad_collate, token_dataset

    class ShuffledBatches(SecretProtectionTrainer):
        def get_train_dataloader(self):
            return DataLoader(self.train_dataset, batch_size=4, shuffle=True, collate_fn=self.data_collator)

    expected = (r"^ShuffledBatches\.get_train_dataloader overrides Trainer\.get_train_dataloader "
                r"\(ShuffledBatches\): not supported with DP training: the DP trainer builds its own "
                r"Poisson-sampled dataloader .*an overridden get_train_dataloader is not supported")
    with pytest.raises(ValueError, match=expected):
        ShuffledBatches(model=tiny_gpt2(), args=dp_config(tmp_path), train_dataset=token_dataset(8),
                        plan=tmp_path / "never_read.json")  # refused before the plan is even loaded

    class PlainShuffledBatches(Trainer):  # attach replaced the override on the instance, silently
        get_train_dataloader = ShuffledBatches.get_train_dataloader

    rows = token_dataset(8)
    plan = make_plan([0.5] * 8, steps=2, noise_multiplier=1.0, rows=rows)
    plain = PlainShuffledBatches(model=tiny_gpt2(), args=dp_config(tmp_path / "plain"),
                                 train_dataset=plan.attach(rows), data_collator=pad_collate)
    with pytest.raises(ValueError, match=r"^PlainShuffledBatches\.get_train_dataloader overrides Trainer\."
                                         r"get_train_dataloader \(PlainShuffledBatches\): not supported"):
        GhostClippingCallback.attach(plain, plan)


# ----------------------------------------------------------------------------- a compiled model
def test_a_compiled_model_is_refused_like_torch_compile_in_args(tmp_path):
    # torch.compile(model) as the model failed at train() with "GPT2LMHeadModel does not support len()"; the
    # clipping hooks are not verified under torch.compile (torch_compile=True in args is refused already).
    from transformers import Trainer

    from hush_hf.trainer import GhostClippingCallback, SecretProtectionTrainer
    from tests.test_trainer_helpers import dp_config, make_plan, pad_collate, token_dataset

    refused = (r"^the model is compiled with torch\.compile \(OptimizedModule\): not supported with DP "
               r"training: the clipping hooks are not verified under torch\.compile; pass the uncompiled "
               r"model")
    with pytest.raises(ValueError, match=refused):
        SecretProtectionTrainer(model=torch.compile(tiny_gpt2()), args=dp_config(tmp_path),
                                train_dataset=token_dataset(8), plan=tmp_path / "never_read.json")
    in_place = tiny_gpt2()
    in_place.transformer.h[1].compile()  # nn.Module.compile: the module compiles its own call
    with pytest.raises(ValueError, match=r"^its module 'transformer\.h\.1' is compiled with torch\.compile "
                                         r"\(GPT2Block\): not supported"):
        SecretProtectionTrainer(model=in_place, args=dp_config(tmp_path), train_dataset=token_dataset(8),
                                plan=tmp_path / "never_read.json")

    rows = token_dataset(8)
    plan = make_plan([0.5] * 8, steps=2, noise_multiplier=1.0, rows=rows)
    plain = Trainer(model=torch.compile(tiny_gpt2()), args=dp_config(tmp_path / "plain"),
                    train_dataset=plan.attach(rows), data_collator=pad_collate)
    with pytest.raises(ValueError, match=refused):
        GhostClippingCallback.attach(plain, plan)
    late = build(tmp_path / "late", model=tiny_gpt2())
    late.model = torch.compile(late.model)  # set after the trainer was built (train() calls model_init again)
    with pytest.raises(ValueError, match=refused):
        late.train()
    assert late.state.global_step == 0


# ----------------------------------------------------------------------------- eval rows scored on labels
def test_an_eval_secret_only_in_the_labels_is_not_counted_as_clean(caplog):
    # A seq2seq eval set: 'text' is the source the input_ids were made from, the labels are the target the
    # model is scored on. Tagging 'text' found no secret and the card said nothing, though the eval loss of
    # row 1 is computed from its target's secret; its rows are now "could not be checked" (None).
    import logging

    import datasets

    from hush_hf.assets.tokenizer_assets import gpt2_tokenizer
    from hush_hf.secrets import SecretSet, tag_dataset, tagger_for
    from hush_hf.trainer.evaluation import EvaluationCoverage, secret_rows

    tokenizer = gpt2_tokenizer()
    secrets = SecretSet.from_records([{"id": "s0", "prior": 1e-3, "target": 0.2, "terms": ["nightjar"]}])
    sources = ["summarise: the meeting moved", "summarise: the code name changed", "summarise: lunch"]
    targets = ["meeting moved", "the code name is nightjar", "soup"]
    seq2seq = datasets.Dataset.from_dict({"text": sources, **tokenizer(sources, text_target=targets)})
    assert "nightjar" not in " ".join(sources) and seq2seq["labels"] != seq2seq["input_ids"]
    with caplog.at_level(logging.WARNING, logger="hush_hf.trainer.evaluation"):
        assert secret_rows(seq2seq, secrets=secrets, tokenizer=tokenizer) is None
        assert secret_rows(seq2seq, secrets=secrets) is None  # no tokenizer: labels not input_ids, unchecked
        assert secret_rows(seq2seq.with_format("torch"), secrets=secrets, tokenizer=tokenizer) is None
    assert "eval row 1: its labels spell text its 'text' column does not hold" in caplog.text
    assert "eval row 0: its labels are not its input_ids" in caplog.text and "nightjar" not in caplog.text
    tagged = tag_dataset(datasets.Dataset.from_dict({"text": sources}), tagger_for(secrets), num_secrets=1)
    for key in ("input_ids", "attention_mask", "labels"):  # ids tagged from the source, before tokenizing
        tagged = tagged.add_column(key, seq2seq[key])
    assert secret_rows(tagged, secrets=secrets, tokenizer=tokenizer) is None

    coverage = EvaluationCoverage(secrets, tokenizer=tokenizer)
    coverage.register(seq2seq)
    coverage.evaluating(None, "eval", seq2seq)
    assert coverage.card_section() == {"evaluations": ["eval"], "rows_with_secrets": 0, "unchecked": ["eval"]}

    # The secret in the source as well (labels a copy of the input with the prompt masked): counted exactly.
    whole = [f"{s} {t}" for s, t in zip(sources, targets, strict=True)]
    causal = datasets.Dataset.from_dict({"text": whole, **tokenizer(whole)})
    causal = causal.map(lambda row: {"labels": [-100] * 3 + row["input_ids"][3:]})
    assert secret_rows(causal, secrets=secrets, tokenizer=tokenizer) == 1
    assert secret_rows(causal, secrets=secrets) == 1
