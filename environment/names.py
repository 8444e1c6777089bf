"""The derived checkpoint-bucket name. Derived and explicit names pass the same validator
(:func:`environment.rules.bucket_name_problem`), so a derived name is never one the spec would
refuse if typed in."""
from __future__ import annotations

import hashlib


def derived_bucket_name(cluster: str, account: str, region: str) -> str:
    """``raytrain-<cluster>-<account>-<region>``; over 63 characters, the cluster part is cut and
    8 hex of a hash of the full name keep it unique (a plain cut could end in '-')."""
    full = "-".join(p for p in ("raytrain", cluster, account, region) if p)
    if len(full) <= 63:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    tail = "-".join(p for p in (account, region) if p)
    room = 63 - len("raytrain--") - len(digest) - 1 - len(tail)
    return f"raytrain-{cluster[:room].rstrip('-')}-{digest}-{tail}"
