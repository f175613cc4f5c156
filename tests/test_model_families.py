"""Every model family users fine-tune, through the trainer: one DP step's update equals an independent
torch.func reference, sum_i min(1, C/||g_i||) g_i / B with g_i the gradient of example i's loss as the
model's own default forward computes it (each example alone, unpadded, no position_ids passed).

Cases: tests/model_families.py (tiny 2-layer configs, eager attention, tied and untied where the
config allows, PEFT adapters: LoRA, DoRA, IA3, VeRA, trainable tokens, mixture-of-experts families with
4 experts and transformers' eager expert loop), each padded and micro-batched (rows of different lengths,
micro-batches of 2) and unpadded (equal lengths, one micro-batch), and the training options (gradient
checkpointing) on the families they name. float64, so the comparison (relative error <= 1e-5 per
parameter) is not limited by rounding. The trainable tokens occur only in the second micro-batch: the
self-check must not pass them unverified on the first.
"""

from __future__ import annotations

import copy

import datasets
import numpy as np
import pytest
import torch
from torch.func import functional_call, grad

from hush_hf.trainer import SecretProtectionTrainer
from tests.model_families import (
    CASES,
    OPTIONS,
    TRAINABLE_TOKENS,
    VOCAB,
    Family,
    Option,
    case_id,
    family_named,
    option_id,
)
from tests.test_trainer_helpers import (
    dp_config,
    make_plan,
    sgd,
    single_thread,  # noqa: F401  (autouse fixture)
)

pytestmark = pytest.mark.filterwarnings("ignore:dp_seed was given", "ignore:noise_multiplier=0")

N, CLIP, RTOL = 4, 1e-4, 1e-5


def rows(kind: str, padded: bool, seed: int = 0) -> datasets.Dataset:
    """N examples (ids >= 3, so never a pad or special id); lengths vary when ``padded``. The trainable
    tokens (``TRAINABLE_TOKENS``) occur in rows 2 and 3 only: never in the first micro-batch of 2."""
    rng = np.random.default_rng(seed)
    lengths = [9, 5, 7, 3] if padded else [7] * N
    data: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": []}
    for row, length in enumerate(lengths):
        drawn = rng.integers(3, VOCAB, size=length).tolist()
        ids = [t + 1 if t in TRAINABLE_TOKENS else t for t in drawn]
        if row >= 2:
            ids[row - 2] = TRAINABLE_TOKENS[row - 2]
        if kind == "seq2seq":
            labels = rng.integers(3, VOCAB, size=max(2, length - 2)).tolist()
        elif kind == "masked":
            labels = [t if k == 0 or rng.random() < 0.5 else -100 for k, t in enumerate(ids)]
        else:
            labels = list(ids)
        data["input_ids"].append(ids)
        data["attention_mask"].append([1] * length)
        data["labels"].append(labels)
    return datasets.Dataset.from_dict(data)


def pad_collator(pad_id: int):
    def collate(features):
        out = {}
        for key, value in (("input_ids", pad_id), ("attention_mask", 0), ("labels", -100)):
            if key not in features[0]:  # the Trainer drops columns the forward does not name (FNet's mask)
                continue
            length = max(len(f[key]) for f in features)
            out[key] = torch.tensor([f[key] + [value] * (length - len(f[key])) for f in features])
        return out

    return collate


def seq2seq_collator(model):
    """transformers' DataCollatorForSeq2Seq with a tiny offline tokenizer (it only pads)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")), pad_token="<pad>", eos_token="</s>"
    )
    return DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100, return_tensors="pt")


def example_inputs(row) -> dict[str, torch.Tensor]:
    """One example alone, as a batch of one: unpadded, no position_ids."""
    ids = torch.tensor(row["input_ids"])[None]
    labels = torch.tensor(row["labels"])[None]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def torch_func_grad(model, params: dict[str, torch.Tensor], row) -> dict[str, torch.Tensor]:
    """Example ``row``'s gradient of the model's own loss, by torch.func."""
    return grad(lambda p: functional_call(model, p, (), example_inputs(row)).loss)(params)


def autograd_grad(model, params: dict[str, torch.Tensor], row) -> dict[str, torch.Tensor]:
    """The same by one autograd backward of the batch of one (for forwards with a custom
    ``autograd.Function`` that torch.func cannot run); a parameter the loss does not reach gets zeros."""
    live = dict(model.named_parameters())
    loss = model(**example_inputs(row)).loss
    found = torch.autograd.grad(loss, [live[n] for n in params], allow_unused=True)
    pairs = zip(params.items(), found, strict=True)
    return {n: torch.zeros_like(p) if g is None else g for (n, p), g in pairs}


def reference_update(model, dataset, example_grad=torch_func_grad) -> dict[str, torch.Tensor]:
    """sum_i min(1, C/||g_i||) g_i / N, g_i = grad of the model's own loss on example i alone."""
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    clipped = 0
    for row in dataset:
        g = example_grad(model, params, row)
        norm = torch.sqrt(sum((v.double() ** 2).sum() for v in g.values()))
        assert norm > 10 * CLIP or norm == 0  # every example is clipped (or trains nothing: no such token)
        clipped += bool(norm > 0)
        for n in total:
            total[n] += (CLIP / norm) * g[n] if norm > 0 else 0.0 * g[n]
    assert clipped >= 2
    return {n: v / N for n, v in total.items()}


# The default run (~60 s on one core) covers every family padded + micro-batched in its first tying
# setting, the other setting where it changes the layer plan (untied heads and embeddings), and the
# unpadded single micro-batch once per loss kind and for LoRA; `pytest -m slow` runs the full grid.
FAST_UNTIED = {"GPT-2", "Llama", "BERT (MLM)", "RoBERTa (MLM)", "T5", "Llama + trainable tokens (peft)"}
FAST_UNPADDED = {"GPT-2", "BERT (MLM)", "T5", "Llama + LoRA (peft)"}
SLOW_OPTIONS = {"T5", "OPT", "DeepSeek-V3", "GPT-OSS"}  # fast representatives: causal LMs, Mixtral


def _fast(family: Family, tied: bool, padded: bool) -> bool:
    first = tied == family.ties[0]
    if padded:
        return first or family.name in FAST_UNTIED
    return first and (family.name in FAST_UNPADDED or not family.pads)


GRID = [
    pytest.param(family, tied, padded, id=f"{case_id(family, tied)}-{'padded' if padded else 'unpadded'}",
                 marks=() if _fast(family, tied, padded) else pytest.mark.slow)
    for family, tied in CASES
    for padded in ((True, False) if family.pads else (False,))
]  # fmt: skip


@pytest.mark.parametrize(("family", "tied", "padded"), GRID)
def test_one_step_update_equals_torch_func_reference(tmp_path, family: Family, tied: bool, padded: bool):
    one_step_matches_reference(tmp_path, family, tied, padded)


OPTION_GRID = [
    pytest.param(o, id=option_id(o), marks=pytest.mark.slow if o.family in SLOW_OPTIONS else ())
    for o in OPTIONS
]


@pytest.mark.parametrize("option", OPTION_GRID)
def test_training_option_keeps_the_update_exact(tmp_path, option: Option):
    """Padded and micro-batched, the option on: the same reference update (computed without it)."""
    base = family_named(option.family)
    trainer = one_step_matches_reference(tmp_path, base, base.ties[0], True, option)
    if option.args.get("gradient_checkpointing") or option.prepare is not None:
        assert any(getattr(m, "gradient_checkpointing", False) is True for m in trainer.model.modules())


def one_step_matches_reference(
    tmp_path, family: Family, tied: bool, padded: bool, option: Option | None = None
) -> SecretProtectionTrainer:
    model = family.build(tied).double()
    dataset = rows(family.kind, padded)
    example_grad = autograd_grad if family.autograd_reference else torch_func_grad
    # (a copy: functional_call can unbind a ParameterDict)
    expected = reference_update(copy.deepcopy(model), dataset, example_grad)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    pad_id = getattr(getattr(model, "config", None), "pad_token_id", None) or 0
    collator = seq2seq_collator(model) if family.kind == "seq2seq" else pad_collator(pad_id)
    plan = make_plan(np.ones(N), steps=1, noise_multiplier=1.0, rows=dataset)
    if option is not None and option.prepare is not None:
        option.prepare(model)
    trainer = SecretProtectionTrainer(
        model=model,
        args=dp_config(
            tmp_path, max_steps=1, per_example_clip_norm=CLIP, noise_multiplier=0.0,
            **{"per_device_train_batch_size": 2 if padded else N, **(option.args if option else {})},
        ),
        train_dataset=plan.attach(dataset),
        data_collator=collator,
        plan=plan,
        optimizers=sgd(model, lr=1.0),
    )  # fmt: skip
    trainer.train()
    after = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    assert set(after) == set(expected)
    scale = torch.sqrt(sum((v**2).sum() for v in expected.values()))
    for name, update in expected.items():
        err = (before[name] - after[name] - update).norm()
        assert err <= RTOL * update.norm() + 1e-9 * scale, (name, float(err), float(update.norm()))
    return trainer
