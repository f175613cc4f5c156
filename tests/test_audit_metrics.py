"""The audit's ``evaluate`` metric modules load offline from the package and agree with the plain functions.

``import evaluate`` takes seconds, so one test loads all four modules.
"""

import math

import numpy as np
import pytest

from hush_hf.audit.exposure import exact_exposure
from hush_hf.audit.membership import roc_auc
from hush_hf.audit.metrics import METRICS, metric_path


def test_metric_path_names_the_module_directory():
    for name in METRICS:
        assert metric_path(name).endswith(f"metrics/{name}")
    with pytest.raises(ValueError, match="'perplexity'"):
        metric_path("perplexity")


def test_all_metrics_load_offline_and_compute(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    import evaluate

    exposure = evaluate.load(metric_path("exposure"))
    others = np.linspace(1.0, 2.0, 999)
    result = exposure.compute(canary_scores=[0.5, 1.5], candidate_scores=[others.tolist(), others.tolist()])
    assert result["exposure"][0] == pytest.approx(math.log2(1000))
    assert result["exposure"][1] == pytest.approx(exact_exposure(1.5, others)[0])
    sampled = exposure.compute(canary_scores=[0.5], candidate_scores=[others.tolist()], space_size=10**6,
                               method="empirical")
    assert sampled["exposure"][0] == pytest.approx(math.log2(10**6))

    membership = evaluate.load(metric_path("membership"))
    scores, labels = [3.0, 2.0, 2.0, 1.0, 2.0, 0.0], [1, 1, 1, 0, 0, 0]
    result = membership.compute(predictions=scores, references=labels, fprs=[0.5])
    assert result["auc"] == pytest.approx(roc_auc([3.0, 2.0, 2.0], [1.0, 2.0, 0.0]))
    assert result["tpr_at_fpr"] == {"0.5": 1.0}

    extraction = evaluate.load(metric_path("extraction"))
    result = extraction.compute(predictions=[[1, 2, 3], [1, 9, 3]], references=[[1, 2, 3], [1, 2, 3]])
    assert result == {"fraction_extracted": 0.5, "num_extracted": 1, "mean_matched_tokens": 2.0}

    reconstruction = evaluate.load(metric_path("reconstruction"))
    result = reconstruction.compute(secret_scores=[0.0, -3.0], candidate_scores=[[-1.0, -2.0], [0.0, -3.0]])
    assert result["rank"] == [1.0, 2.5]
    assert result["probability"][0] == pytest.approx(1 / (1 + math.exp(-1) + math.exp(-2)))
    assert result["fraction_ranked_first"] == 0.5


def test_importing_the_audit_package_loads_neither_torch_nor_evaluate():
    import subprocess
    import sys

    code = ("import sys, hush_hf.audit as a; a.metric_path('exposure'); "
            "print(sorted(m for m in ('torch', 'evaluate', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
