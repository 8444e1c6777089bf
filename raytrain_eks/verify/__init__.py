"""The environment against the AWS account and the cluster, before a deploy and before a job:
``verify`` (the command, ``command.py``, and its checks: account, egress, an existing cluster,
the pinned charts), ``capacity`` (where the GPU types and reservations are), ``lock`` (the image
tag pinned to its digest) and ``summary`` (what the spec deploys, priced)."""
