import numpy as np
import pyarrow as pa
import pytest

from hush_hf.planning.memberships import membership_matrix
from hush_hf.planning.probabilities import sampling_probabilities


def test_membership_matrix_from_lists_marks_each_example_once():
    m = membership_matrix([[0, 2], [], [2, 2, 1]], num_secrets=3)
    assert m.shape == (3, 3)
    dense = m.toarray()
    np.testing.assert_array_equal(dense, [[1, 0, 0], [0, 0, 1], [1, 0, 1]])


def test_membership_matrix_from_arrow_matches_python_lists():
    lists = [[1], [0, 1], [], [3], [2, 0]]
    arrow = pa.chunked_array([pa.array(lists[:2]), pa.array(lists[2:])])
    np.testing.assert_array_equal(
        membership_matrix(arrow, num_secrets=4).toarray(), membership_matrix(lists, num_secrets=4).toarray()
    )


@pytest.mark.parametrize("bad", [[[0], [5]], [[0], [-1]]])
def test_unknown_secret_is_named_with_its_example(bad):
    with pytest.raises(ValueError, match=r"example 1 names unknown secret -?\d"):
        membership_matrix(bad, num_secrets=3)


def test_non_integer_secret_index_is_refused():
    with pytest.raises(ValueError, match="non-integer secret index 1.5"):
        membership_matrix([[0], [1.5]], num_secrets=3)


def test_sampling_probabilities_sum_to_expected_batch_size():
    w = np.array([1.0, 0.5, 0.0, 0.25, 1.0])
    rho = sampling_probabilities(w, expected_batch_size=2.0)
    assert rho.sum() == pytest.approx(2.0, rel=1e-15)
    np.testing.assert_allclose(rho / w.clip(1e-300), np.where(w > 0, 2.0 / w.sum(), 0.0))
    assert rho.max() <= 1.0


def test_sampling_probabilities_refuse_a_batch_larger_than_the_retained_data():
    with pytest.raises(ValueError, match=r"expected_batch_size=3.0 exceeds the sum of example weights 2.75"):
        sampling_probabilities(np.array([1.0, 1.0, 0.75]), 3.0)


@pytest.mark.parametrize("weights, msg", [([0.5, 1.5], "example 1 has weight 1.5"), ([np.nan], "example 0")])
def test_sampling_probabilities_refuse_bad_weights(weights, msg):
    with pytest.raises(ValueError, match=msg):
        sampling_probabilities(np.array(weights), 0.1)
