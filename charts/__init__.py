"""The cdk8s app: the KubeRay RayCluster and one RayJob per jobs/*.toml, from environment.toml.

- :mod:`charts.main`         the app (``cdk8s synth`` runs ``python -m charts.main``); ``synth(env, outdir)``;
                             ``read_rayjob(path)``: a synthesized RayJob's entrypoint and runtime env
- :mod:`charts.cluster_spec` THE RayCluster spec builder (the RayCluster and every RayJob's cluster)
- :mod:`charts.jobs`         job config + spec -> entrypoint, world size, hashes
- :mod:`charts.validate`     strict KubeRay CRD + Kubernetes schema checks (``python -m charts.validate``)
- ``charts/imports/``        bindings GENERATED from ``charts/crds/`` (see cdk8s.yaml); never edited

Importing this package imports nothing heavy: the bindings load only with the chart modules.
"""


class ChartError(ValueError):
    """The one error type a user can cause while synthesizing the manifests: a job config or spec
    that the cluster cannot run; ``str(err)`` is the one line to print (file, field, bad value,
    what would be right)."""
