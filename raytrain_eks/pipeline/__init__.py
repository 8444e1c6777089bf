"""The redeploy pipeline's CodeBuild steps, as code the buildspecs run (``python -m raytrain_eks.pipeline``).

Each step is a function of (environment.toml, the synthesized ``dist/``, kubectl on PATH, AWS
through boto3) so the walk-through test runs the very same code against a local registry,
moto and a fake kubectl. Stage order and what each proves:

``choose-digest``  (Synth) the ONE source of truth for what a run deploys: the promoted digest
                   in SSM, unless the run carries an explicit one (watcher, operator rollback)
                   or the committed one is new to the pipeline (:mod:`.digests`).
``smoke``          the smoke RayJob on a RayCluster OF ITS OWN built from the new digest; the
                   image IDs its pods report become run.json's ``image_ran`` (:mod:`.smoke`).
``gate``           record checks + regression gate against the last promoted smoke run; the
                   side-by-side report goes into the bucket next to the runs (:mod:`.gate`).
``apply``          the long-lived RayCluster (``upgradeStrategy: Recreate``), waiting until
                   every pod reports the new image ID (:mod:`.kube`).
Any failure in these steps rolls the long-lived cluster back to the promoted digest and records
the rollback with its reason in the promotion history (:mod:`.rollback`).
"""
