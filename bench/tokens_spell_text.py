"""What checking that a tokenized dataset's tokens spell its tagged text costs at train start.

``SecretProtectionTrainer`` decodes every row's ``input_ids`` (and ``labels``) and checks that each run
between special tokens spells a part of the row's text (``hush_hf.trainer.text_tokens``), when it tags
a tokenized dataset from its text column. This times that check on ``--rows`` random-word texts of 60
words, tokenized to 64 tokens with the offline BERT-uncased tokenizer (the arxiv_mlm recipe's rows),
median of ``--repeats`` fresh runs; run it from two trees to compare them.

    python bench/tokens_spell_text.py [--rows 12862] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from hush_hf.assets.tokenizer_assets import bert_uncased_tokenizer
    from hush_hf.trainer.text_tokens import first_row_not_spelled

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=12862)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tokenizer = bert_uncased_tokenizer()
    generator = random.Random(0)
    vocabulary = [w for w in tokenizer.get_vocab() if w.isalpha() and len(w) > 2][:5000]
    texts = [" ".join(generator.choice(vocabulary) for _ in range(60)) for _ in range(args.rows)]
    ids = tokenizer(texts, truncation=True, max_length=64)["input_ids"]
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        assert first_row_not_spelled(texts, ids, tokenizer) is None
        seconds.append(time.perf_counter() - start)
    print(f"{args.rows} rows of 64 tokens: {statistics.median(seconds):.2f} s (median of {args.repeats}; "
          f"runs {', '.join(f'{s:.2f}' for s in seconds)})")


if __name__ == "__main__":
    main()
