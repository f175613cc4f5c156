"""``tensor_views``: a view only where it changes the shape."""

import torch

from hush_hf.clipping.tensor_views import as_rows, as_shape


def test_as_shape_returns_the_tensor_itself_when_the_shape_matches_and_a_view_otherwise() -> None:
    flat = torch.arange(12.0)
    assert as_shape(flat, (12,)) is flat
    assert as_shape(flat, torch.Size([12])) is flat
    shaped = as_shape(flat, (3, 4))
    assert shaped.shape == (3, 4) and shaped.data_ptr() == flat.data_ptr()
    assert torch.equal(shaped, flat.view(3, 4))


def test_as_rows_keeps_a_two_dimensional_tensor_and_flattens_the_rest_per_example() -> None:
    bias = torch.randn(4, 7)
    assert as_rows(bias) is bias
    weight = torch.randn(4, 3, 5)
    rows = as_rows(weight)
    assert rows.shape == (4, 15) and torch.equal(rows, weight.reshape(4, -1))
