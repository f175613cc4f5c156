"""The reconstruction metric, for ``evaluate.load(metric_path("reconstruction"))``.

A package (this file) so that wheels ship the metric module beside it.
"""
