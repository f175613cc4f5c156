"""Getting the protection plan a DP run trains with, and checking it fits the run and the data.

The plan's per-example sampling probabilities are indexed by dataset row: a dataset shuffled,
filtered, edited or replaced after planning would sample the wrong examples with the wrong
probabilities and void the per-secret bounds. So the rows must be the ones the plan was made from
(its row binding, :mod:`hush_hf.planning.binding`), the secret ids must still describe the rows'
content (tagged-text digests, marks in step with the tokens), and every check here runs before
training starts.
"""

from __future__ import annotations

import hashlib
import logging
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from hush_hf.data import SECRET_IDS_COLUMN, arrow_columns, column_names
from hush_hf.planning.binding import is_bookkeeping
from hush_hf.planning.plan import (
    SAMPLING_PROB_COLUMN,
    WEIGHT_COLUMN,
    ProtectionPlan,
    differing_memberships,
    plan_protection,
)
from hush_hf.planning.verification import Verification, recompute_bounds
from hush_hf.trainer.validation import check_noise_multiplier

logger = logging.getLogger(__name__)

PLAN_COLUMNS = (SECRET_IDS_COLUMN, WEIGHT_COLUMN, SAMPLING_PROB_COLUMN)


def is_plan_column(name: str) -> bool:
    """A column the DP step drops before the model: ``PLAN_COLUMNS``, secret marks, tagged-text digests."""
    return is_bookkeeping(name)


def loud_warning(message: str) -> None:
    """A warning that reaches both ``warnings`` filters and the logs."""
    warnings.warn(message, UserWarning, stacklevel=3)
    logger.warning(message)


def load_plan(plan: ProtectionPlan | str | Path) -> ProtectionPlan:
    if isinstance(plan, ProtectionPlan):
        return plan
    if isinstance(plan, (str, Path)):
        return ProtectionPlan.load(plan)
    raise ValueError(f"plan must be a ProtectionPlan or a path to a saved plan, got a {type(plan).__name__}")


def load_secrets(secrets: Any) -> Any:
    """A ``SecretSet`` from a SecretSet or a .json/.jsonl/.csv path."""
    from hush_hf.secrets import SecretSet

    if isinstance(secrets, SecretSet):
        return secrets
    if isinstance(secrets, (str, Path)):
        return SecretSet.load(secrets)
    raise ValueError(
        f"secrets must be a SecretSet or a path to a secrets file, got a {type(secrets).__name__}"
    )


def column(dataset: Any, name: str) -> Any:
    """A column in the dataset's current row order (an Arrow array for ``datasets.Dataset``)."""
    import datasets

    if isinstance(dataset, datasets.Dataset):
        return arrow_columns(dataset, [name])[0][1]  # respects shuffles/selects, unlike dataset.data
    return [dataset[i][name] for i in range(len(dataset))]


MARK_LINE = "tokenizer = hush_hf.mark_secrets(tokenizer, secrets)"


def prepare_secret_ids(
    dataset: Any,
    *,
    secret_set: Any = None,
    plan: ProtectionPlan | None = None,
    text_column: str = "text",
    name: str = "train_dataset",
    tokenizer: Any = None,
) -> Any:
    """The dataset with a ``secret_ids`` column, from (in order of preference):

    1. the per-token marks column of :func:`hush_hf.mark_secrets` (a row contains secret j when any
       of its tokens is marked with j); the marks column is then dropped, so it never reaches the model;
       ``labels`` that are other tokens than ``input_ids`` must spell no secret the marks lack
       (:func:`check_label_marks`);
    2. an existing ``secret_ids`` column (e.g. from ``tag_dataset``); an untokenized dataset's other
       string columns must add no secret to them;
    3. tagging ``text_column`` with ``secret_set`` (an untokenized dataset: every string column, which
       its collator may read); a tokenized dataset's ``input_ids`` must then spell that text (checked
       with ``tokenizer``: :mod:`hush_hf.trainer.text_tokens`; trusted, with a loud warning, without one).

    Marks or tags made with another secret set than ``secret_set`` or ``plan`` are refused
    (fingerprints), and so are marks out of step with ``input_ids`` and ids tagged from other text
    than the rows hold now; ids that cannot be checked (their text column is gone) are trusted with a
    loud warning. With none of the three (a tokenized dataset without marks): an error that says
    which line to add. With a plan and no secret set, the dataset may also carry no ids at all (its
    rows are matched to the plan by ``check_plan_fits``). ``name``: how errors call the dataset.
    """
    from hush_hf.secrets.marks import find_marks_column, marks_fingerprint, secret_ids_from_marks
    from hush_hf.secrets.tagging import check_fingerprint, check_secret_ids_current, dataset_fingerprint

    expected = secret_set.fingerprint if secret_set is not None else None
    plan_fingerprint = plan.secret_set_fingerprint if plan is not None else None
    against = "the secrets given" if secret_set is not None else "the plan"
    names = column_names(dataset)
    marks = find_marks_column(names)
    if marks is not None:
        found = marks_fingerprint(marks)
        what = f"{name}'s secret marks column"
        check_fingerprint(found, expected, what=what, against=against)
        check_fingerprint(found, plan_fingerprint, what=what, against="the plan")
        import datasets

        if not isinstance(dataset, datasets.Dataset):
            raise ValueError(
                f"{name} is a {type(dataset).__name__} with secret marks; pass a datasets.Dataset"
            )
        check_marks_in_step(dataset, marks, name=name)
        ids = secret_ids_from_marks(column(dataset, marks))
        check_label_marks(dataset, ids.to_pylist(), secret_set=secret_set, tokenizer=tokenizer, name=name)
        drop = [marks] + ([SECRET_IDS_COLUMN] if SECRET_IDS_COLUMN in names else [])
        dataset = dataset.remove_columns(drop)
        logger.info("secret_ids derived from the per-token marks column (dropped before the model)")
        feature = datasets.Sequence(datasets.Value("int64"))  # typed even when no row has a secret
        return _vouched(dataset.add_column(SECRET_IDS_COLUMN, ids.to_pylist(), feature=feature))
    if SECRET_IDS_COLUMN in names:
        found = dataset_fingerprint(dataset)
        what = f"{name}'s '{SECRET_IDS_COLUMN}' column"
        check_fingerprint(found, expected, what=what, against=against)
        check_fingerprint(found, plan_fingerprint, what=what, against="the plan")
        if found is None and secret_set is not None:
            loud_warning(
                f"{name}'s '{SECRET_IDS_COLUMN}' column records no secret set (not made by "
                "hush_hf.secrets.tag_dataset with tagger_for): it is trusted to match the secrets given"
            )
        import datasets

        unchecked = (
            check_secret_ids_current(dataset, secret_set=secret_set, text_column=text_column, what=name)
            if isinstance(dataset, datasets.Dataset)
            else f"{name}'s '{SECRET_IDS_COLUMN}' cannot be checked against its rows (not a "
            "datasets.Dataset): they are trusted to list every secret each row holds, unchecked"
        )
        if unchecked:
            loud_warning(unchecked)
        elif isinstance(dataset, datasets.Dataset):
            from hush_hf.secrets.tagging import tagged_text_columns

            sources = tagged_text_columns(names, SECRET_IDS_COLUMN) or [text_column]
            for source in sources:  # ids checked against a text: the tokens must be that text's too
                _check_tokens_of(dataset, source, tokenizer=tokenizer, name=name)
            _check_untagged_columns(dataset, sources, secret_set=secret_set, name=name)
        return _vouched(dataset)
    if secret_set is None:
        return dataset
    import datasets

    from hush_hf.secrets import tagger_for
    from hush_hf.secrets.tagging import tag_columns, text_sources

    if isinstance(dataset, datasets.Dataset) and text_column in dataset.column_names:
        _check_tokens_of(dataset, text_column, tokenizer=tokenizer, name=name)
        sources = text_sources(dataset, text_column)
        if len(sources) > 1:
            logger.warning(
                "%s is not tokenized, so the data collator may read any of its columns: its text columns %s "
                "are tagged as well as %r", name, sources[1:], text_column,
            )
        return _vouched(tag_columns(dataset, tagger_for(secret_set), sources, num_secrets=len(secret_set)))
    raise ValueError(
        f"{name} has no secret marks, no '{SECRET_IDS_COLUMN}' column and no text column "
        f"{text_column!r} (columns: {names}), so its secrets cannot be found. Add this line where the "
        f"tokenizer is built: `{MARK_LINE}` (secrets: your SecretSet or secrets file); its output then "
        "carries per-token marks through tokenizing, grouping and packing"
    )


def _check_untagged_columns(dataset: Any, sources: list[str], *, secret_set: Any, name: str) -> None:
    """An untokenized dataset's string columns its ids were not tagged from (the collator may read any:
    :func:`hush_hf.secrets.tagging.text_sources`) must add no secret to a row's ids: ValueError naming the
    first row and column that do; without ``secret_set``, a loud warning that they are unchecked."""
    from hush_hf.secrets.tagging import text_sources

    if sources[0] not in column_names(dataset):
        return
    others = [c for c in text_sources(dataset, sources[0]) if c not in sources]
    if not others:
        return
    if secret_set is None:
        loud_warning(
            f"{name} is not tokenized, and its text column{'s' if len(others) > 1 else ''} "
            f"{', '.join(map(repr, others))} {'were' if len(others) > 1 else 'was'} not tagged: the data "
            f"collator may read {'them' if len(others) > 1 else 'it'}, so a secret there is trusted to be in "
            f"'{SECRET_IDS_COLUMN}' too, unchecked; remove the columns the collator does not read"
        )
        return
    from hush_hf.secrets import tagger_for

    tagger = tagger_for(secret_set)
    ids = column(dataset, SECRET_IDS_COLUMN).to_pylist()
    for other in others:
        for row, text in enumerate(column(dataset, other).to_pylist()):
            missing = tagger(text).difference(ids[row] or ()) if isinstance(text, str) else set()
            if missing:
                tagged = ", ".join(map(repr, sources))
                raise ValueError(
                    f"{name} row {row}: its column {other!r} spells secret #{min(missing)}, which its "
                    f"'{SECRET_IDS_COLUMN}' (tagged from {tagged}) lack; the dataset is not tokenized, so "
                    "the data collator may read that column: tag every column it reads "
                    "(hush_hf.secrets.tag_dataset on one column joining them), or remove the columns it "
                    "does not read"
                )


def _vouched(dataset: Any) -> Any:
    """``dataset``, recorded as one whose secret ids were checked here, or warned about (planning it then
    warns no second time: :data:`hush_hf.secrets.tagging.VOUCHED`)."""
    from hush_hf.secrets.tagging import VOUCHED

    VOUCHED.add(dataset)
    return dataset


def _check_tokens_of(dataset: Any, text_column: str, *, tokenizer: Any, name: str) -> None:
    """A tokenized dataset's ``input_ids`` must spell its tagged ``text_column`` (the model reads the tokens;
    :mod:`hush_hf.trainer.text_tokens`); trusted with a loud warning when there is no tokenizer to check."""
    if "input_ids" not in dataset.column_names or text_column not in dataset.column_names:
        return
    from hush_hf.trainer.text_tokens import can_decode, check_tokens_spell_text

    if not can_decode(tokenizer):
        loud_warning(
            f"{name} is tagged from its {text_column!r} column, and its input_ids are trusted to be that "
            "text's tokens (no tokenizer to check them: pass processing_class=tokenizer)"
        )
        return
    check_tokens_spell_text(dataset, tokenizer, text_column=text_column, name=name)


def check_marks_in_step(dataset: Any, marks: str, *, name: str = "train_dataset") -> None:
    """ValueError if the marks column and ``input_ids`` hold different numbers of tokens in some row."""
    from hush_hf.secrets.marks import misaligned_marks

    if "input_ids" not in column_names(dataset):
        return
    rows = misaligned_marks(column(dataset, marks), column(dataset, "input_ids"))
    if rows.size:
        raise ValueError(
            f"{name}'s secret marks are out of step with 'input_ids' at {rows.size} of {len(dataset)} rows "
            f"(first: row {int(rows[0])}): the tokens were changed after the marking tokenizer made them, "
            "so the marks no longer say which tokens hold a secret; tokenize with the marking tokenizer in "
            "the last step that changes input_ids"
        )


LABELS_FIX = (
    "tokenize inputs and targets in one call, tokenizer(inputs, text_target=targets), which marks each row "
    "with the secrets of both"
)


def check_label_marks(
    dataset: Any, marked: list[list[int]], *, secret_set: Any, tokenizer: Any, name: str
) -> None:
    """ValueError naming the first row whose ``labels`` spell a secret its marks (``marked``) lack.

    Only rows whose labels are other tokens than their ``input_ids`` (-100 aside) are decoded and tagged
    (:mod:`hush_hf.secrets.label_marks`); without ``secret_set`` or a ``tokenizer`` to decode with, such
    rows are trusted to be marked with their labels' secrets, with a loud warning.
    """
    from hush_hf.secrets.label_marks import first_unmarked_label_secret, labels_beyond_inputs
    from hush_hf.trainer.text_tokens import can_decode, token_columns

    tokens = token_columns(dataset)
    if "labels" not in tokens or "input_ids" not in tokens:
        return
    rows = labels_beyond_inputs(tokens["input_ids"], tokens["labels"])
    if not rows.size:
        return
    if secret_set is None or not can_decode(tokenizer):
        missing = "the secrets" if secret_set is None else "a tokenizer (processing_class)"
        loud_warning(
            f"{name}'s labels are other tokens than its input_ids at {rows.size} of {len(dataset)} rows "
            f"(first: row {int(rows[0])}), and the secret marks follow input_ids: the labels are trusted to "
            f"spell no secret their row's marks lack, unchecked (without {missing} to check them); "
            + LABELS_FIX
        )
        return
    from hush_hf.secrets import tagger_for

    found = first_unmarked_label_secret(
        rows, tokens["labels"], marked, tokenizer=tokenizer, tagger=tagger_for(secret_set)
    )
    if found is not None:
        row, secret = found
        raise ValueError(
            f"{name} row {row}: its labels spell secret #{secret}, which its secret marks do not hold (the "
            "marks follow input_ids, and these labels are other tokens, e.g. a target tokenized apart), so "
            f"the row would train on the secret unprotected; {LABELS_FIX}"
        )


def drop_marks(dataset: Any) -> Any:
    """``dataset`` (a Dataset, or a dict of them) without secret marks columns (never model inputs)."""
    import datasets

    from hush_hf.secrets.marks import MARKS_PREFIX

    if isinstance(dataset, dict):
        return {name: drop_marks(part) for name, part in dataset.items()}
    if isinstance(dataset, datasets.Dataset):
        marks = [c for c in dataset.column_names if c.startswith(MARKS_PREFIX)]
        return dataset.remove_columns(marks) if marks else dataset
    return dataset


def plan_for_dataset(
    dataset: Any,
    secret_set: Any,
    *,
    expected_batch_size: float,
    steps: int,
    lp_c: float,
    accountant: str,
    allow_unmatched: bool = False,
) -> ProtectionPlan:
    """Solve the plan for a tagged dataset (Hush Alg. 2, lines 1-5), bound to its rows."""
    import datasets

    rows = isinstance(dataset, datasets.Dataset)  # else a map-style dataset of dict rows: bound below
    plan = plan_protection(
        dataset if rows else column(dataset, SECRET_IDS_COLUMN),
        secret_set.priors,
        secret_set.targets,
        expected_batch_size=expected_batch_size,
        steps=steps,
        lp_c=lp_c,
        accountant=accountant,
        allow_unmatched=allow_unmatched,
        secret_set_fingerprint=secret_set.fingerprint,
    )
    return plan if rows else plan.bound_to(dataset)


def plan_digest(plan: ProtectionPlan) -> str:
    """A fingerprint of what the DP step uses from a plan (rho, sigma, B, T), to compare across ranks."""
    digest = hashlib.sha256(np.ascontiguousarray(plan.sampling_probs, dtype=np.float64).tobytes())
    digest.update(repr((plan.noise_multiplier, plan.expected_batch_size, plan.steps)).encode())
    return digest.hexdigest()


def check_expected_batch_size(plan: ProtectionPlan, expected_batch_size: float | None) -> None:
    """ValueError if a configured B differs from the plan's (None: the plan's B is used)."""
    if expected_batch_size is not None and not math.isclose(
        expected_batch_size, plan.expected_batch_size, rel_tol=1e-9
    ):
        raise ValueError(
            f"expected_batch_size={expected_batch_size!r} but the plan is calibrated for "
            f"expected_batch_size={plan.expected_batch_size!r}"
        )


def check_plan_fits(plan: ProtectionPlan, *, steps: int, dataset: Any, tokenizer: Any = None) -> None:
    """ValueError unless the plan was made for this T and exactly these dataset rows.

    The rows must be the ones the plan is bound to (same content, same order:
    :meth:`ProtectionPlan.check_rows`); a ``hush_sampling_prob`` column (``plan.attach``) must hold the
    plan's rho row by row; a ``secret_ids`` column must still describe the text it was tagged from and
    equal the plan's memberships row by row, and, with a ``tokenizer`` that decodes, the rows'
    ``input_ids`` must spell that text (:mod:`hush_hf.trainer.text_tokens`: the model reads the tokens).
    """
    if plan.steps != steps:
        raise ValueError(f"max_steps={steps} but the plan is calibrated for steps={plan.steps}")
    if dataset is None or not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise ValueError(
            "train_dataset must be a map-style dataset with len() (the plan samples its rows), "
            f"got {type(dataset).__name__}"
        )
    if len(dataset) != plan.num_examples:
        raise ValueError(
            f"train_dataset has {len(dataset)} rows but the plan covers {plan.num_examples} examples"
        )
    plan.check_rows(dataset, what="train_dataset")
    names = column_names(dataset)
    if SAMPLING_PROB_COLUMN in names:
        probs = np.asarray(column(dataset, SAMPLING_PROB_COLUMN), dtype=np.float64)
        differs = np.flatnonzero(probs != plan.sampling_probs)
        if differs.size:
            raise ValueError(
                f"train_dataset column '{SAMPLING_PROB_COLUMN}' differs from the plan at {differs.size} rows "
                f"(first: row {int(differs[0])}); was it attached from another plan?"
            )
    if SECRET_IDS_COLUMN in names:
        import datasets

        if isinstance(dataset, datasets.Dataset):
            from hush_hf.secrets.tagging import VOUCHED, check_secret_ids_current, tagged_text_columns
            from hush_hf.trainer.text_tokens import can_decode

            check_secret_ids_current(dataset, what="train_dataset")  # what it cannot check: warned before
            # prepare_secret_ids checked (or warned about) the rows it returned: SecretProtectionTrainer's
            if can_decode(tokenizer) and dataset not in VOUCHED:  # without one: warned before
                for source in tagged_text_columns(names, SECRET_IDS_COLUMN):
                    _check_tokens_of(dataset, source, tokenizer=tokenizer, name="train_dataset")
        check_secret_ids_match(plan, column(dataset, SECRET_IDS_COLUMN))


def check_secret_ids_match(plan: ProtectionPlan, secret_ids: Any) -> None:
    """Each row's secret ids must be the plan's memberships of that row (and so each secret's example
    count and sum of rho the plan's).

    Catches a dataset re-tagged after planning, or rows reordered or filtered (the plan's rho would
    then belong to other examples). A plan without recorded memberships is checked per secret
    (counts and sums of rho), which equal multisets do not distinguish.
    """
    from hush_hf.accounting import SecretGroups
    from hush_hf.planning.memberships import membership_matrix

    if plan.memberships is not None:
        rows = differing_memberships(plan.memberships, secret_ids)
        if rows.size:
            raise ValueError(
                f"train_dataset's '{SECRET_IDS_COLUMN}' differ from the plan's memberships at {rows.size} "
                f"rows (first: row {int(rows[0])}); was the dataset re-tagged, shuffled or filtered after "
                "planning?"
            )
        return
    groups = SecretGroups.from_membership(
        membership_matrix(secret_ids, plan.num_secrets), plan.sampling_probs
    )
    sizes, sums = groups.sizes, groups.sum_rho()
    bad = np.flatnonzero(
        (sizes != plan.secrets.num_examples) | ~np.isclose(sums, plan.secrets.sum_rho, rtol=1e-9, atol=1e-12)
    )
    if bad.size:
        j = int(bad[0])
        raise ValueError(
            f"train_dataset's '{SECRET_IDS_COLUMN}' do not match the plan for {bad.size} secrets "
            f"(first: secret #{j}: {int(sizes[j])} examples with sum(rho)={sums[j]:.6g} here, "
            f"{int(plan.secrets.num_examples[j])} with {plan.secrets.sum_rho[j]:.6g} in the plan); "
            "was the dataset shuffled, filtered or re-tagged after planning?"
        )


#: Threads for re-verifying a plan at train start: each holds ~25 MB of arrays at once (the demo's
#: largest laws: one-step grids of 2^15 points), so a many-core machine does not take gigabytes.
MAX_VERIFICATION_THREADS = 8


def verify_plan_for_training(
    plan: ProtectionPlan, requested: float | None, *, secret_ids: Any = None
) -> tuple[float, Verification]:
    """The sigma to train with and every secret's bound recomputed at it (never read from the plan).

    sigma is the plan's unless ``requested``. The bounds are recomputed from the plan's rho, the
    memberships (the dataset's ``secret_ids`` when it has them, else the plan's), sigma and T with the
    plan's accountant. A plan that misses a target at the plan's own sigma is refused (an edited or
    mis-made plan); with an explicitly requested sigma it trains, with a loud warning. The laws are
    evaluated on as many threads as torch computes with, at most MAX_VERIFICATION_THREADS (the bounds
    do not depend on it).
    """
    import torch

    check_noise_multiplier(requested)
    sigma = float(plan.noise_multiplier if requested is None else requested)
    workers = min(max(1, torch.get_num_threads()), MAX_VERIFICATION_THREADS)
    verification = recompute_bounds(plan, sigma, secret_ids=secret_ids, workers=workers)
    if verification.meets_targets:
        logger.info("protection plan verified: %s", verification.describe())
        if requested is not None and sigma > plan.noise_multiplier:
            logger.info("noise_multiplier=%.6g exceeds the plan's %.6g (more protection)", sigma,
                        plan.noise_multiplier)
        return sigma, verification
    if requested is None:
        raise ValueError(
            f"the protection plan does NOT meet its targets: {verification.describe()}. The plan's own "
            "numbers cannot be trusted (was it edited, or made with a given noise_multiplier?); re-create it "
            "with `hush plan` / plan_protection, or set noise_multiplier explicitly to train without the "
            "certified targets"
        )
    if sigma == 0:
        loud_warning(
            "noise_multiplier=0: training WITHOUT noise. This is a non-private baseline; the secrets' "
            f"targets do NOT hold and the model may reveal them ({verification.describe()})."
        )
    else:
        relation = (
            f"is below the plan's calibrated {plan.noise_multiplier:.6g}"
            if sigma < plan.noise_multiplier
            else "was set explicitly"
        )
        loud_warning(
            f"noise_multiplier={sigma:.6g} {relation}: the certified per-secret targets do NOT hold; "
            f"{verification.describe()}."
        )
    return sigma, verification
