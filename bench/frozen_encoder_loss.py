"""The demo's test loss per model: the full forward against the frozen encoder's cached states, one process.

    .venv/bin/python bench/frozen_encoder_loss.py [--repeats 3]

Builds what ``make demo`` scores (arxiv_mlm's offline data, the 228 test paragraphs collated once with
the fixed masks, ``bert_masked_lm(None, trainable="head")``), then alternates ``mean_token_loss`` (what
every run's scoring ran before: the encoder forward, then the head) with ``FrozenEncoderTestLoss`` (the
head on the states computed once), on the same model in the same process, wall and process-CPU seconds
of each call, and checks the two floats are equal. The cache's own construction (one encoder pass over
the test batches, once per recipe) is printed apart.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(call):  # noqa: ANN001, ANN201
    wall, cpu = time.perf_counter(), time.process_time()
    value = call()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import torch
    from transformers import DataCollatorForLanguageModeling

    from hush_hf import experiments as ex
    from hush_hf.assets import bert_uncased_tokenizer
    from hush_hf.trainer import masked_positions_loss

    torch.set_num_threads(os.cpu_count() or 1)  # as make demo's launch gives them
    sys.path.insert(0, str(ROOT / "recipes"))
    import arxiv_mlm as recipe

    recipe_args, config = recipe.EXPERIMENT.parse(["--output_dir", str(ROOT / "outputs" / "bench_frozen")])
    _, test_text, *_ = recipe.load_data(recipe_args)
    tokenizer = bert_uncased_tokenizer()
    test = ex.tokenize_text(test_text, tokenizer=tokenizer, text_column=recipe_args.text_column,
                            max_length=recipe_args.max_seq_length)
    fixed = DataCollatorForLanguageModeling(tokenizer, recipe_args.mlm_probability,
                                            seed=recipe_args.secret_seed)
    batches = ex.collate_batches(test, fixed, recipe_args.eval_batch_size)
    model = ex.bert_masked_lm(None, trainable="head", seed=config.seed)
    full = partial(ex.mean_token_loss, batches=batches, per_example_loss=masked_positions_loss, causal=False)
    full(model)  # the first call probes the model's positions (two forwards); not what a run repeats
    cache, wall, cpu = timed(lambda: ex.FrozenEncoderTestLoss(model, batches))
    print(f"{len(test)} test rows in {len(batches)} batches, {torch.get_num_threads()} threads, load average "
          f"{os.getloadavg()[0]:.1f}; cache built once: wall {wall:.2f} s, CPU {cpu:.2f} s", flush=True)
    rows = {"full forward": [], "cached encoder": []}
    values = set()
    for _ in range(args.repeats):
        for name, call in (("full forward", lambda: full(model)), ("cached encoder", lambda: cache(model))):
            value, wall, cpu = timed(call)
            rows[name].append((wall, cpu))
            values.add(value)
    base = [sum(x[k] for x in rows["full forward"]) / args.repeats for k in (0, 1)]
    for name, found in rows.items():
        mean = [sum(x[k] for x in found) / args.repeats for k in (0, 1)]
        print(f"{name:15s} per model: wall {mean[0]:6.2f} s (x{mean[0] / base[0]:.2f}), CPU {mean[1]:6.2f} s "
              f"(x{mean[1] / base[1]:.2f}); each call: " + ", ".join(f"{w:.2f}" for w, _ in found))
    print(f"test loss: {sorted(values)} ({'equal' if len(values) == 1 else 'DIFFERENT'}); load average after "
          f"{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
