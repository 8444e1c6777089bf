"""CDK stacks: network, storage, cluster or attached (an existing cluster), and the pipeline
(``pipeline.py`` with ``pipeline_access.py``, ``pipeline_builds.py``, ``pipeline_watcher.py``).
Stacks compose constructs from :mod:`infra.constructs`; every value comes from the environment
spec."""
