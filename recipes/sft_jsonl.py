"""Fine-tune a causal LM on your own JSONL file while protecting the secrets in it (in the style of TRL's
example scripts: one dataclass of script arguments, every training flag from the config).

    python recipes/sft_jsonl.py --dataset_file my_data.jsonl --secrets_file secrets.csv \
        --model_name_or_path Qwen/Qwen3-0.6B --output_dir out --max_steps 2000 --expected_batch_size 256

Every ``SecretProtectionConfig`` flag works (``TrainingArguments``' own, plus ``--lp_c``, ``--accountant``,
``--per_example_clip_norm``, ...). Without ``--model_name_or_path`` it runs offline on a tiny GPT-2 built
from its config with GPT-2's tokenizer (``hush_hf.assets``): a quick check of your data and secrets file.
``hush verify --as-pushed <output_dir>`` re-checks what ``save_model`` published (``--as-pushed``: the files
push_to_hub uploads, not the local checkpoints).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from datasets import load_dataset
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
)

from hush_hf import SecretProtectionConfig, SecretProtectionTrainer, mark_secrets
from hush_hf.assets import gpt2_small_config, gpt2_tokenizer


@dataclass
class ScriptArguments:
    dataset_file: str = field(metadata={"help": "Your JSONL file, one example per line."})
    text_column: str = field(default="text", metadata={"help": "The field holding each example's text."})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Hub id or local folder; default: a tiny GPT-2 built offline."}
    )
    max_length: int = field(default=128, metadata={"help": "Tokens per example (longer ones are cut)."})


def main(argv: list[str] | None = None) -> SecretProtectionTrainer:
    parser = HfArgumentParser((ScriptArguments, SecretProtectionConfig))
    script_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    if training_args.secrets_file is None:
        parser.error("--secrets_file is required: your secrets (CSV or JSON: id, prior, target, terms)")

    # The model and its tokenizer: yours, or a tiny GPT-2 built from its config (nothing downloaded).
    if script_args.model_name_or_path is not None:
        tokenizer = AutoTokenizer.from_pretrained(script_args.model_name_or_path)
        model = AutoModelForCausalLM.from_pretrained(script_args.model_name_or_path)
    else:
        from transformers import GPT2LMHeadModel

        tokenizer = gpt2_tokenizer()
        config = gpt2_small_config(len(tokenizer), n_layer=2, n_embd=64, n_head=2, n_positions=512)
        model = GPT2LMHeadModel(config)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token

    # Tag the secrets: the marking tokenizer adds per-token secret marks to the rows it tokenizes.
    marking = mark_secrets(tokenizer, training_args.secrets_file)
    dataset = load_dataset("json", data_files=script_args.dataset_file, split="train")

    def tokenize(batch: dict[str, list]) -> dict[str, list]:
        return marking(batch[script_args.text_column], truncation=True, max_length=script_args.max_length)

    dataset = dataset.map(tokenize, batched=True, remove_columns=dataset.column_names)

    # Plan and train: the trainer finds each row's secrets in its marks, plans exactly these rows (LP
    # weights, sampling probabilities, the noise every secret's target needs) and takes T DP steps.
    trainer = SecretProtectionTrainer(
        model=model,
        args=training_args,
        train_dataset=dataset,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.save_model()  # weights + model card with its "Secret protection" section, plan, privacy report
    return trainer


if __name__ == "__main__":
    main()
