"""The exposure metric, for ``evaluate.load(metric_path("exposure"))``.

A package (this file) so that wheels ship the metric module beside it.
"""
