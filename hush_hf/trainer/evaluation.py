"""Evaluation on rows that hold secrets is outside the protection plan.

The plan bounds what the trained weights reveal about each secret (Hush, Def. 3.1); anything computed
from the weights alone, or from the weights and data that hold no secret, is post-processing and stays
covered. An evaluation metric on a row that holds secret j (eval loss, perplexity, accuracy) is computed
from that row itself, without clipping or noise: it is a function of the secret (a guessed value can be
confirmed by the loss it gets), so publishing it, or picking a checkpoint by it, is not covered.

So the trainer counts the evaluation rows that hold a secret (from the secret marks of
:func:`hush_hf.mark_secrets`, a ``secret_ids`` column, or by tagging the text column with the run's
secrets), warns loudly with the count (never the content), and the model card says so when evaluations
ran on such rows (or on rows it could not check).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from hush_hf.trainer.plan_setup import SECRET_IDS_COLUMN, column, column_names, load_secrets, loud_warning

logger = logging.getLogger(__name__)

#: The key of a single (not named) eval dataset.
SINGLE = "eval"


def secret_rows(
    dataset: Any, *, secrets: Any = None, text_column: str = "text", tokenizer: Any = None
) -> int | None:
    """How many rows of ``dataset`` hold a secret; None when it cannot be told (no marks, no
    ``secret_ids``, and no text column with the run's ``secrets``: a SecretSet or a secrets file; or
    tokens the text column may not hold: given ``tokenizer``, rows whose ``input_ids`` or ``labels`` spell
    other text, see :mod:`hush_hf.trainer.text_tokens`; without one, ``labels`` other than the rows'
    ``input_ids``, such as a seq2seq target)."""
    import datasets

    from hush_hf.secrets.marks import find_marks_column, secret_ids_from_marks

    if not hasattr(dataset, "__len__"):  # an iterable dataset: rows cannot be counted up front
        return None
    names = column_names(dataset)
    marks = find_marks_column(names)
    if marks is not None:
        marked = secret_ids_from_marks(column(dataset, marks)).to_pylist()
        return _marked_rows(dataset, marked, secrets, tokenizer)
    if SECRET_IDS_COLUMN in names and _current_ids(dataset, secrets, text_column):
        if isinstance(dataset, datasets.Dataset):
            from hush_hf.secrets.tagging import tagged_text_columns

            sources = tagged_text_columns(names, SECRET_IDS_COLUMN) or [text_column]
            if any(_tokens_not_of(dataset, source, tokenizer) for source in sources if source in names):
                return None
        return _non_empty(column(dataset, SECRET_IDS_COLUMN))
    if secrets is None or not isinstance(dataset, datasets.Dataset) or text_column not in names:
        return None
    from hush_hf.secrets import tagger_for
    from hush_hf.secrets.tagging import tag_columns, text_sources

    if _tokens_not_of(dataset, text_column, tokenizer):
        return None
    secret_set = load_secrets(secrets)
    sources = text_sources(dataset, text_column)  # untokenized: every text column the collator may read
    tagged = tag_columns(
        dataset.select_columns(sources), tagger_for(secret_set), sources, num_secrets=len(secret_set)
    )
    return _non_empty(column(tagged, SECRET_IDS_COLUMN))


def _marked_rows(dataset: Any, marked: list[list[int]], secrets: Any, tokenizer: Any) -> int | None:
    """Rows holding a secret by their marks or by what their ``labels`` spell where those are other tokens
    than the row's ``input_ids`` (:mod:`hush_hf.secrets.label_marks`); None (warned) when such labels
    cannot be read (no tokenizer or no secrets)."""
    from hush_hf.secrets.label_marks import label_secrets, labels_beyond_inputs
    from hush_hf.trainer.text_tokens import token_columns

    tokens = token_columns(dataset)
    rows = (labels_beyond_inputs(tokens["input_ids"], tokens["labels"])
            if "labels" in tokens and "input_ids" in tokens else np.zeros(0, dtype=np.int64))
    if rows.size and (secrets is None or tokenizer is None):
        logger.warning("eval row %d: its labels are not its input_ids, and there is no tokenizer or secret "
                       "set to read them; its rows are counted as unknown", int(rows[0]))
        return None
    if rows.size:
        from hush_hf.secrets import tagger_for

        tagger = tagger_for(load_secrets(secrets))
        found = label_secrets(tokenizer, tagger, [tokens["labels"][r] for r in rows])
        for row, extra in zip(rows.tolist(), found, strict=True):
            marked[row] = sorted(set(marked[row]) | extra)
    return _non_empty(marked)


def _tokens_not_of(dataset: Any, text_column: str, tokenizer: Any) -> bool:
    """Whether the rows' tokens may hold text ``text_column`` does not, so that its tags may miss a secret
    the model reads or is scored on (warned): with ``tokenizer``, a row whose ``input_ids`` or ``labels``
    spell other text (a seq2seq target beside a source-only column: :mod:`hush_hf.trainer.text_tokens`);
    without one, ``labels`` that are not the row's own ``input_ids`` (-100 aside), which nothing checks."""
    from hush_hf.trainer.text_tokens import first_unspelled, token_columns

    if tokenizer is not None:
        found = first_unspelled(dataset, tokenizer, text_column=text_column)
        if found is not None:
            tokens, row = found
            logger.warning("eval row %d: its %s spell text its %r column does not hold", row, tokens,
                           text_column)
        return found is not None
    token_lists = token_columns(dataset)
    if "labels" in token_lists and "input_ids" in token_lists:
        pairs = zip(token_lists["input_ids"], token_lists["labels"], strict=True)
        for row, (ids, labels) in enumerate(pairs):
            ids, labels = np.asarray(ids), np.asarray(labels)
            if ids.shape != labels.shape or not bool(np.all((labels == ids) | (labels < 0))):
                logger.warning(
                    "eval row %d: its labels are not its input_ids, and there is no tokenizer to check that "
                    "they spell its %r column; its rows are counted as unknown", row, text_column,
                )
                return True
    return False


def _current_ids(dataset: Any, secrets: Any, text_column: str) -> bool:
    """Whether the ``secret_ids`` of an eval dataset can be counted as they are: False (with a warning)
    when they were tagged from other text than the rows hold now (stale: e.g. all empty after a map),
    so the rows are tagged again from the text where the run's secrets are known, or left uncounted."""
    import datasets

    from hush_hf.secrets.tagging import check_secret_ids_current

    if not isinstance(dataset, datasets.Dataset):
        return True
    secret_set = load_secrets(secrets) if secrets is not None else None
    try:
        check_secret_ids_current(dataset, secret_set=secret_set, text_column=text_column, what="the eval set")
    except ValueError as error:
        logger.warning("%s; its rows are counted from the text instead where it can be tagged", error)
        return False
    return True


def _non_empty(lists: Any) -> int:
    values = lists.to_pylist() if hasattr(lists, "to_pylist") else list(lists)
    return sum(1 for ids in values if ids)


class EvaluationCoverage:
    """The trainer's record of the eval datasets it was given and the evaluations that ran on them.

    ``rows[name]``: rows holding a secret in eval dataset ``name`` (``"eval"`` for a single one), None
    if unknown; ``ran``: the metric prefixes of the evaluations that ran.
    """

    def __init__(self, secrets: Any = None, *, text_column: str = "text", tokenizer: Any = None) -> None:
        self.secrets, self.text_column, self.tokenizer = secrets, text_column, tokenizer
        self.rows: dict[str, int | None] = {}
        self.ran: dict[str, int | None] = {}
        self.counted: Any = None  # the trainer's eval_dataset that ``rows`` counts (see ``follow``)

    def register(self, eval_dataset: Any) -> None:
        """Count (and warn about) the secret rows of the trainer's ``eval_dataset`` (a dict: each)."""
        if eval_dataset is None:
            return
        parts = eval_dataset if isinstance(eval_dataset, dict) else {SINGLE: eval_dataset}
        for name, part in parts.items():
            self.rows[name] = self._check(part, name)

    def follow(self, trainer_eval_dataset: Any) -> None:
        """Count the trainer's ``eval_dataset`` again if it was replaced since it was counted (a dataset
        set on the trainer after construction would otherwise be described by the old one's counts)."""
        if trainer_eval_dataset is not self.counted:
            self.rows = {}
            self.register(trainer_eval_dataset)
            self.counted = trainer_eval_dataset

    def evaluating(self, eval_dataset: Any, prefix: str, trainer_eval_dataset: Any) -> None:
        """Record an ``evaluate(eval_dataset, metric_key_prefix=prefix)`` call that computes metrics
        (dicts are split by Trainer into one call per dataset; those calls are the ones recorded)."""
        self.follow(trainer_eval_dataset)
        split_by_trainer = eval_dataset is None and isinstance(trainer_eval_dataset, dict)
        if isinstance(eval_dataset, dict) or split_by_trainer:
            return
        if isinstance(eval_dataset, str):
            self.ran[prefix] = self.rows.get(eval_dataset)
        elif eval_dataset is None:
            self.ran[prefix] = self.rows.get(SINGLE)
        elif prefix not in self.ran:  # a dataset passed to evaluate(): checked on its first evaluation
            self.ran[prefix] = self._check(eval_dataset, prefix)

    def predicting(self, test_dataset: Any, prefix: str) -> None:
        """Record a ``predict(test_dataset, metric_key_prefix=prefix)`` call: its predictions and metrics
        are computed from those rows just as an evaluation's are (counted once per prefix)."""
        if prefix not in self.ran:
            self.ran[prefix] = self._check(test_dataset, prefix)

    def _check(self, dataset: Any, name: str) -> int | None:
        count = secret_rows(
            dataset, secrets=self.secrets, text_column=self.text_column, tokenizer=self.tokenizer
        )
        if count:
            loud_warning(
                f"eval dataset {name!r}: {count} of {len(dataset)} rows hold protected secrets. Evaluation "
                "metrics on them (eval loss, perplexity, ...) are computed without noise from the secrets "
                "themselves and are NOT covered by the protection plan: keep them private, evaluate on rows "
                "without secrets, and do not pick checkpoints by them"
            )
        elif count is None:
            logger.warning(
                "eval dataset %r could not be checked for secrets (no secret marks, no '%s' column, or no "
                "text column and secrets to tag it with): metrics on rows holding secrets are not covered "
                "by the protection plan", name, SECRET_IDS_COLUMN,
            )
        return count

    def card_section(self) -> dict[str, Any] | None:
        """What the model card states: None when no evaluation ran on rows holding (or maybe holding)
        secrets."""
        flagged = {prefix: rows for prefix, rows in self.ran.items() if rows != 0}
        if not flagged:
            return None
        return {
            "evaluations": sorted(flagged),
            "rows_with_secrets": sum(rows for rows in flagged.values() if rows is not None),
            "unchecked": sorted(prefix for prefix, rows in flagged.items() if rows is None),
        }


def metric_feedback(args: Any, callbacks: Any) -> str | None:
    """The first setting of the run that lets evaluation metrics choose the trained weights, or None:
    ``load_best_model_at_end`` (the saved weights are the best-scoring checkpoint), the
    ``reduce_lr_on_plateau`` schedule (every later step's size follows the metric) or an
    ``EarlyStoppingCallback`` (the number of steps does)."""
    from transformers import EarlyStoppingCallback

    if args.load_best_model_at_end:
        return "load_best_model_at_end=True"
    schedule = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
    if schedule == "reduce_lr_on_plateau":
        return f"lr_scheduler_type={schedule!r}"
    if any(isinstance(callback, EarlyStoppingCallback) for callback in callbacks):
        return "EarlyStoppingCallback"
    return None


def check_no_metric_feedback(coverage: EvaluationCoverage, args: Any, callbacks: Any) -> None:
    """ValueError when evaluation metrics choose the weights and an eval dataset holds (or may hold)
    secrets: the weights would then be a function of those rows without noise, outside the plan."""
    feedback = metric_feedback(args, callbacks)
    flagged = {name: rows for name, rows in coverage.rows.items() if rows != 0}
    if feedback is None or not flagged:
        return
    name, rows = next(iter(flagged.items()))
    holds = f"has {rows} rows holding protected secrets" if rows else "could not be checked for secrets"
    raise ValueError(
        f"{feedback} lets evaluation metrics choose the trained weights, but eval dataset {name!r} {holds}: "
        "those metrics are computed from the rows without noise, so the weights would not be covered by the "
        "plan. Evaluate on rows without secrets (with secret marks or a 'secret_ids' column if they cannot "
        "be tagged from a text column), or turn it off"
    )
