"""The cdk8s app: the KubeRay RayCluster and one RayJob per jobs/*.toml, from environment.toml.

- :mod:`charts.main`         the app (``cdk8s synth`` runs ``python -m charts.main``); ``synth(env, outdir)``
                             and ``synth_charts``, the one pipeline a submitted run's manifests take too;
                             ``read_rayjob(path)``: a synthesized RayJob's entrypoint and runtime env
- :mod:`charts.ray_charts`   the charts: the RayCluster, the RayJobs, their NetworkPolicies (``to_bindings``)
- :mod:`charts.cluster_spec` THE RayCluster spec builder (the RayCluster and every RayJob's cluster), pod security
- :mod:`charts.jobs`         job config + spec -> entrypoint, world size, hashes; whether its workers fit
- :mod:`charts.validate`     strict KubeRay CRD + Kubernetes schema checks (``python -m charts.validate``)
- ``charts/imports/``        bindings GENERATED from ``charts/crds/`` (see cdk8s.yaml); never edited

Importing this package imports nothing heavy: the bindings load only with the chart modules.
"""


class ChartError(ValueError):
    """The one error type a user can cause while synthesizing the manifests: a job config or spec
    that the cluster cannot run; ``str(err)`` is the one line to print (file, field, bad value,
    what would be right)."""
