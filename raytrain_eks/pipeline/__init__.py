"""The redeploy pipeline's CodeBuild steps, as code the buildspecs run (``python -m raytrain_eks.pipeline``).

Each step is a function of (environment.toml, the synthesized ``dist/``, kubectl on PATH, AWS
through boto3) so the walk-through test runs the very same code against a local registry,
moto and a fake kubectl. Stage order and what each proves:

``check-run``      (Synth) not the run CodePipeline starts on creation, and the deployed pipeline
                   stack matches the commit (:mod:`.synth`).
``choose-digest``  (Synth) the ONE source of truth for what a run deploys: the promoted digest
                   in SSM, unless the run carries an explicit one (watcher, operator rollback)
                   or the committed one is new to the pipeline (:mod:`.synth`); records the
                   promoted digest it saw in ``dist/pipeline-run.json``.
``smoke``          the smoke RayJob on a RayCluster OF ITS OWN built from the new digest; the
                   image IDs its pods report become run.json's ``image_ran`` (:mod:`.smoke`).
``gate``           record checks + regression gate against the newest comparable promoted run
                   of another digest; the side-by-side report goes into the bucket (:mod:`.gate`).
``apply``          unless another execution promoted since Synth: the long-lived RayCluster
                   (``upgradeStrategy: Recreate``), waiting until it is ready with every pod
                   Ready on the new image ID (:mod:`.apply_promote`, :mod:`.kube`).
``promote``        compare-and-swap on the promoted digest Synth saw (:mod:`.apply_promote`).
Any failure in these steps is recorded in the promotion history with its reason; the
long-lived cluster goes back to the manifest the last promotion applied, if it differs from it
(:mod:`.rollback`, which also classes each failure: the image's or infrastructure).
"""
