"""Fixtures every test gets."""

from __future__ import annotations

import pytest
from hypothesis import settings

from hush_hf.trainer.seed_store import DP_STATE_DIR_ENV

# The same examples on every run (each test's own fixed sequence): a CI run cannot fail on an example no
# earlier run tried. A failure found here is kept as a named regression test.
settings.register_profile("deterministic", derandomize=True, print_blob=True)
settings.load_profile("deterministic")


@pytest.fixture(autouse=True)
def private_dp_state_dir(tmp_path_factory, monkeypatch):
    """DP seeds of the test's runs go to a fresh temporary folder (outside every test's output_dir),
    never to the user's ~/.cache; launched processes inherit it through the environment."""
    folder = tmp_path_factory.mktemp("dp_state")
    monkeypatch.setenv(DP_STATE_DIR_ENV, str(folder))
    return folder
