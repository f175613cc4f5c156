"""The extraction metric, for ``evaluate.load(metric_path("extraction"))``.

A package (this file) so that wheels ship the metric module beside it.
"""
