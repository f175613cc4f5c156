"""The membership metric, for ``evaluate.load(metric_path("membership"))``.

A package (this file) so that wheels ship the metric module beside it.
"""
