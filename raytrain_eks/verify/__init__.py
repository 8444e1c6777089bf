"""The environment against the AWS account and the cluster, before a deploy and before a job:
``summary`` (what the spec deploys, priced) and ``verify`` (both commands in ``command.py``;
verify's checks: account, egress, an existing cluster, the pinned charts), ``capacity`` (where the
GPU types and reservations are) and ``lock`` (the image tag pinned to its digest)."""
