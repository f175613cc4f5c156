"""A plan trains exactly the rows it was made from (issue 18 s4): row binding, stale tags, marks in step.

The attacks of the issue are written out: a shuffled dataset without its secret_ids, 24 unrelated rows
each holding the secret, and a ``map`` appending the secret to every row after tagging (4 rows hold it
when tagged, 24 after). Each must be refused, with an error that names how many rows differ and the
first one and never the rows' content.
"""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest

from hush_hf.planning import ProtectionPlan, plan_protection
from hush_hf.planning.binding import RowBinding
from hush_hf.secrets import SecretSet, mark_secrets, secret_ids_from_marks, tag_dataset, tagger_for
from hush_hf.secrets.tagging import check_secret_ids_current

pytestmark = pytest.mark.filterwarnings("ignore:.*mark more than")

SECRET = "falcon"
SECRETS = SecretSet.from_records([{"name": "falcon", "p": 1e-4, "r": 5e-2, "terms": [SECRET]}])
N, HOLDING = 24, (2, 7, 11, 19)  # 24 rows, 4 of which hold the secret


def texts() -> list[str]:
    return [f"row {i} says {'project ' + SECRET if i in HOLDING else 'nothing much'} today" for i in range(N)]


def tagged() -> datasets.Dataset:
    data = datasets.Dataset.from_dict({"text": texts(), "source": [f"doc-{i % 5}" for i in range(N)]})
    return tag_dataset(data, tagger_for(SECRETS), num_secrets=1)


def make_plan(rows: datasets.Dataset) -> ProtectionPlan:
    return plan_protection(rows, SECRETS.priors, SECRETS.targets, expected_batch_size=4.0, steps=3)


def refusal(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and SECRET not in message.lower() and "nothing much" not in message
    return message


def test_the_issue_attacks_on_attach_are_refused_naming_the_rows_that_differ():
    rows = tagged()
    plan = make_plan(rows)
    assert list(plan.secrets.num_examples) == [4] and plan.rows.columns == ("source", "text")
    attached = plan.attach(rows)  # the rows it was made from: accepted
    np.testing.assert_array_equal(attached["hush_sampling_prob"], plan.sampling_probs)

    shuffled = rows.shuffle(seed=0).remove_columns("secret_ids")
    moved = int(np.sum(np.asarray(shuffled["text"]) != np.asarray(rows["text"])))
    first = int(np.flatnonzero(np.asarray(shuffled["text"]) != np.asarray(rows["text"]))[0])
    assert moved > 0
    message = refusal(lambda: plan.attach(shuffled))
    assert (
        f"differs from the rows the plan was made from at {moved} of 24 rows (first: row {first})" in message
    )

    unrelated = datasets.Dataset.from_dict(
        {"text": [f"unrelated {i} {SECRET}" for i in range(N)], "source": ["x"] * N}
    )
    assert "at 24 of 24 rows (first: row 0)" in refusal(lambda: plan.attach(unrelated))

    appended = rows.map(lambda row: {"text": row["text"] + f" {SECRET}"})  # secret_ids now stale
    assert "at 24 of 24 rows (first: row 0)" in refusal(lambda: plan.attach(appended))
    edited = rows.map(lambda row, i: {"source": "y" if i == 5 else row["source"]}, with_indices=True)
    assert "at 1 of 24 rows (first: row 5)" in refusal(lambda: plan.attach(edited))
    filtered = rows.select([i for i in range(N) if i != 3] + [0])  # one row dropped, one padded back
    assert "at 21 of 24 rows (first: row 3)" in refusal(lambda: plan.attach(filtered))


def test_a_plan_cannot_be_made_from_secret_ids_left_stale_by_a_map():
    """Tagged when 4 rows hold the secret; after the map 24 do, but the column still says 4."""
    appended = tagged().map(lambda row: {"text": row["text"] + f" {SECRET}"})
    assert sum(map(len, appended["secret_ids"])) == 4
    assert sum(len(tagger_for(SECRETS)(t)) for t in appended["text"]) == 24
    message = refusal(lambda: make_plan(appended))
    assert (
        "'secret_ids' were tagged from other text than column 'text' holds now, at 24 of 24 rows" in message
    )
    with pytest.raises(ValueError, match="at 24 of 24 rows"):
        check_secret_ids_current(appended.shuffle(seed=1))  # the digests follow the rows
    # Text gone: nothing to check against; said, not hidden.
    gone = check_secret_ids_current(appended.remove_columns("text"))
    assert "cannot be checked against the text they were tagged from (column 'text' is gone)" in gone
    assert check_secret_ids_current(tagged().shuffle(seed=2)) is None  # shuffled with its text: still valid


def test_secret_ids_without_recorded_text_are_tagged_again_when_the_secrets_are_known():
    plain = datasets.Dataset.from_dict({"text": texts()})
    right = plain.add_column("secret_ids", [[0] if i in HOLDING else [] for i in range(N)])
    assert check_secret_ids_current(right, secret_set=SECRETS) is None
    over = plain.add_column("secret_ids", [[0]] * N)  # over-tagged: safe, accepted
    assert check_secret_ids_current(over, secret_set=SECRETS) is None
    under = plain.add_column("secret_ids", [[0] if i in HOLDING[:2] else [] for i in range(N)])
    with pytest.raises(
        ValueError, match=r"lack secrets that tagging column 'text' finds, at 2 of 24 rows \(first: row 11\)"
    ):
        check_secret_ids_current(under, secret_set=SECRETS)
    unknown = check_secret_ids_current(right)  # no secret set: cannot tag again
    assert "record no text they were tagged from" in unknown


def test_the_local_plan_file_keeps_the_row_digests_and_the_published_copy_has_none(tmp_path):
    rows = tagged()
    plan = make_plan(rows)
    local = plan.save(tmp_path / "plan.json", include_fingerprint=True)
    published = plan.save(tmp_path / "hush_plan.json")
    stored = json.loads(local.read_text())["rows"]
    assert stored["columns"] == ["source", "text"] and len(bytes.fromhex(stored["key"])) == 32
    published_text = published.read_text()
    assert "rows" not in json.loads(published_text) and stored["digests"][:40] not in published_text
    assert stored["key"] not in published_text
    ProtectionPlan.load(local).attach(rows)  # the local file binds the rows
    message = refusal(lambda: ProtectionPlan.load(published).attach(rows))
    assert message.startswith("the plan records no row digests, so dataset's rows cannot be matched")
    assert "key" not in repr(plan.rows) and stored["key"] not in repr(plan)
    # The digests are keyed: the same rows under another plan's key give other digests.
    again = make_plan(rows)
    assert not np.any(np.all(again.rows.digests == plan.rows.digests, axis=1))


def test_the_same_values_stored_differently_still_match_and_columns_must_be_the_same(tmp_path):
    rows = tagged().add_column("input_ids", [[i, 50000 + i, 3] for i in range(N)])
    plan = make_plan(rows)
    narrow = rows.cast_column("input_ids", datasets.Sequence(datasets.Value("int32")))
    plan.attach(narrow)
    rows.save_to_disk(str(tmp_path / "saved"))
    plan.attach(datasets.load_from_disk(str(tmp_path / "saved")))
    plan.attach(plan.attach(rows))  # hush's own columns are not content
    message = refusal(lambda: plan.attach(rows.remove_columns("text")))
    assert "dataset's columns are not those the plan was made from (['input_ids', 'source', 'text']): " \
        "['text'] missing, [] added" in message
    message = refusal(lambda: plan.attach(rows.add_column("length", [3] * N)))
    assert "[] missing, ['length'] added" in message


def test_binding_a_plan_to_rows_checks_their_secret_ids():
    rows = tagged()
    secret_ids = rows["secret_ids"]
    plan = plan_protection(secret_ids, SECRETS.priors, SECRETS.targets, expected_batch_size=4.0, steps=3)
    assert plan.rows is None  # from a bare column: bound to nothing
    plan.bound_to(rows).attach(rows)
    rotated = rows.select(list(range(1, N)) + [0])
    with pytest.raises(
        ValueError, match=r"'secret_ids' differ from the plan's memberships at 8 rows \(first: row 1\)"
    ):
        plan.bound_to(rotated)
    with pytest.raises(ValueError, match="dataset has 23 rows but the plan covers 24 examples"):
        plan.bound_to(rows.select(range(23)))


def test_plans_of_tokenized_rows_from_the_marking_tokenizer():
    from hush_hf.assets.tokenizer_assets import gpt2_tokenizer
    from hush_hf.trainer.plan_setup import prepare_secret_ids

    tokenizer = mark_secrets(gpt2_tokenizer(), SECRETS)
    data = datasets.Dataset.from_dict({"text": texts()})
    tokens = data.map(lambda batch: tokenizer(batch["text"]), batched=True, remove_columns=["text"])
    ids = prepare_secret_ids(tokens, secret_set=SECRETS)  # marks -> secret_ids; marks dropped
    assert [i for i, s in enumerate(ids["secret_ids"]) if s] == list(HOLDING)
    plan = make_plan(ids)
    assert plan.rows.columns == ("attention_mask", "input_ids")
    plan.attach(ids)
    plan.bound_to(tokens)  # the marks give the same memberships row by row
    assert "at 24 of 24 rows" in refusal(lambda: plan.attach(ids.shuffle(seed=0)))
    # A later map that truncates the tokens but keeps the marks leaves them out of step: refused.
    cut = tokens.map(
        lambda row: {"input_ids": row["input_ids"][:3], "attention_mask": row["attention_mask"][:3]}
    )
    message = refusal(lambda: prepare_secret_ids(cut, secret_set=SECRETS))
    assert "secret marks are out of step with 'input_ids' at 24 of 24 rows (first: row 0)" in message
    marks = [c for c in tokens.column_names if c.startswith("secret_marks_")][0]
    assert secret_ids_from_marks(tokens.with_format("arrow")[marks]).to_pylist() == ids["secret_ids"]


def test_row_binding_json_is_validated():
    binding = RowBinding.of(tagged())
    data = binding.to_json()
    restored = RowBinding.from_json(data, N)
    np.testing.assert_array_equal(restored.digests, binding.digests)
    with pytest.raises(ValueError, match="rows do not describe the plan's 23 examples"):
        RowBinding.from_json(data, 23)
    with pytest.raises(ValueError, match="non-empty list of column names"):
        RowBinding.from_json({**data, "columns": []}, N)


def test_every_column_the_dp_step_drops_is_bookkeeping_and_nothing_else_is():
    from hush_hf.planning.binding import is_bookkeeping
    from hush_hf.trainer.plan_setup import PLAN_COLUMNS

    rows = tagged()
    extra = [c for c in rows.column_names if c not in ("text", "source")]
    assert extra == ["secret_ids", "secret_ids__hush_tagged_text__text"]
    assert all(is_bookkeeping(c) for c in (*PLAN_COLUMNS, *extra, "secret_marks_0123456789abcdef"))
    assert not any(is_bookkeeping(c) for c in ("text", "input_ids", "labels", "crt_public", "secret_idsx"))
