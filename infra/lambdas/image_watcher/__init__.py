"""The image watcher of the redeploy pipeline (an AWS Lambda, Python) and the modules the
pipeline's steps share with it.

- :mod:`.watcher`: the watcher's policy and the Lambda entry point ``watcher.watch`` (the function's
  handler ``image_watcher.watcher.watch``, on a schedule): resolves the spec's image tag to its
  current digest and, when it differs from the promoted digest (an SSM parameter) and was never
  tried (or its tries failed for reasons not the image's: up to ``pipeline.max_attempts`` tries,
  a deferred one only inside ``pipeline.maintenance_window``), starts the pipeline with
  ``IMAGE_DIGEST`` set to it; a digest whose image is not for the nodes' platform is recorded as
  rejected instead.
- :mod:`.registry`: the tag -> digest resolution through the registry's HTTP API, which the
  ``lock`` and ``verify`` commands also use.
- :mod:`.history`: the promotion history in DynamoDB (triggered, applied, promoted, rejected,
  rolled back, ended) and the promoted digest the pipeline serializes on.
- :mod:`.promote`: promotion, run by the pipeline (``python -m raytrain_eks.pipeline promote``, a
  CodeBuild action, raytrain_eks/pipeline/apply_promote.py), not by a Lambda: checks the smoke
  run's record, writes the digest it proved into the SSM parameter and records the promotion.

Standard library + boto3 (both in the Lambda Python runtime; boto3 imported only where a client
is made) + the repository's ``environment`` package and the ``spec_schema`` it reads the spec with,
which the Lambda asset carries (infra/stacks/pipeline_watcher.py stages them by following the
imports).
"""
