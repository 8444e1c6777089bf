"""The image watcher and the promotion step of the redeploy pipeline (AWS Lambda, Python).

- ``handler.watch``: on a schedule, resolves the spec's image tag to its current digest (through
  :mod:`.registry`) and, when it differs from the
  promoted digest (an SSM parameter) and was never tried, starts the pipeline with
  ``IMAGE_DIGEST`` set to it.
- ``handler.promote``: the pipeline's last action; writes the digest the smoke run proved into
  the SSM parameter and records the promotion (digest, time, smoke run record) in DynamoDB.

Standard library + boto3 only (both are in the Lambda Python runtime).
"""
