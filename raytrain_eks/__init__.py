"""raytrain-eks operator tooling: the `raytrain-eks` command (summary, preflight, report, lock).

Runs on the operator's machine or in the pipeline, never inside the training pods.
"""
