"""What binding a plan to its rows costs: per-row digests, the checks at use, stale-tag detection.

    python bench/row_binding.py [--rows 100000] [--tokens 128 512] [--repeat 3]

Token rows: ``input_ids`` (int32, GPT-2-sized vocabulary), ``attention_mask`` (int8) and ``labels``
(int64, a copy of the ids), lengths uniform in [L/2, L]; text rows of ~500 characters. Times (median of
``--repeat``) for:

- ``row_digests`` on the token columns (the primitive) and on the text column;
- ``RowBinding.of(dataset)`` (what planning adds) and ``check`` on the same dataset and on a shuffled one
  (an index mapping: the rows are read through it);
- the tagged-text check of ``check_secret_ids_current`` (the digests of the current text against the
  column ``tag_dataset`` wrote), against its fallback for ids without digests: tagging the text again.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def timed(call, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def token_dataset(rows: int, length: int, seed: int = 0):
    import datasets
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    lengths = rng.integers(length // 2, length + 1, size=rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ids = rng.integers(0, 50257, size=int(offsets[-1])).astype(np.int32)
    table = pa.table({
        "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)),
        "attention_mask": pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.ones(ids.size, np.int8))),
        "labels": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids.astype(np.int64))),
    })  # fmt: skip
    return datasets.Dataset(table)


def main() -> None:
    import datasets
    import pyarrow.compute as pc

    from hush_hf.digests import row_digests
    from hush_hf.planning.binding import RowBinding, arrow_columns
    from hush_hf.secrets import SecretSet, tag_dataset, tagger_for
    from hush_hf.secrets.tagging import check_secret_ids_current

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    datasets.disable_progress_bars()

    print(f"{args.rows} rows; median of {args.repeat}")
    for length in args.tokens:
        data = token_dataset(args.rows, length)
        columns = arrow_columns(data, ["attention_mask", "input_ids", "labels"])
        tokens = int(pc.sum(pc.list_value_length(columns[1][1])).as_py())
        primitive = timed(lambda columns=columns: row_digests(columns), args.repeat)
        binding = RowBinding.of(data)
        bind = timed(lambda data=data: RowBinding.of(data), args.repeat)
        check = timed(lambda data=data, binding=binding: binding.check(data), args.repeat)
        shuffled = data.shuffle(seed=0)
        check_shuffled = timed(lambda s=shuffled, b=binding: b.differing_rows(s), args.repeat)
        print(
            f"tokens L in [{length // 2}, {length}] ({tokens / args.rows:.0f}/row, 3 columns): row_digests "
            f"{primitive:.2f} s, bind {bind:.2f} s, check {check:.2f} s, check of a shuffled copy "
            f"{check_shuffled:.2f} s"
        )

    words = ["lorem", "ipsum", "dolor", "amet", "elit", "tempor", "magna", "falcon", "veniam", "nostrud"]
    rng = np.random.default_rng(1)
    texts = [" ".join(rng.choice(words, size=80)) for _ in range(args.rows)]
    data = datasets.Dataset.from_dict({"text": texts})
    text_digests = timed(lambda: row_digests(arrow_columns(data, ["text"])), args.repeat)
    secrets = SecretSet.from_records([{"name": "falcon", "p": 1e-6, "r": 1e-3, "terms": ["falcon"]}])
    start = time.perf_counter()
    tagged = tag_dataset(data, tagger_for(secrets), num_secrets=1)
    tagging = time.perf_counter() - start
    digest_check = timed(lambda: check_secret_ids_current(tagged), args.repeat)
    untracked = tagged.remove_columns([c for c in tagged.column_names if "__hush_tagged_text__" in c])
    start = time.perf_counter()
    check_secret_ids_current(untracked, secret_set=secrets)
    retag_check = time.perf_counter() - start
    print(
        f"text (~{np.mean([len(t) for t in texts]):.0f} chars/row): row_digests {text_digests:.2f} s; "
        f"tag_dataset {tagging:.2f} s (digests included); stale-tag check: digests {digest_check:.2f} s, "
        f"tagging again (no digests recorded) {retag_check:.2f} s"
    )


if __name__ == "__main__":
    main()
