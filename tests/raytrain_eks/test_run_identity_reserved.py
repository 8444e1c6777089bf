"""A run named like an account another role is associated with (the smoke runs' ``raytrain-smoke``,
the long-lived cluster's ``ray-train``: run names admit both) must neither borrow that association
nor delete it when the run ends. The EKS API lists associations by service account without their
role (ListPodIdentityAssociations' summary has no roleArn), so only Describe tells them apart."""
from __future__ import annotations

import pytest

from pod_identity_double import PodIdentityApi
from raytrain_eks.backends import eks

RUN_ROLE = "arn:aws:iam::111111111111:role/raytrain-run"
SMOKE_ROLE = "arn:aws:iam::111111111111:role/raytrain-smoke-role"


def test_a_run_named_like_the_smoke_account_neither_borrows_nor_removes_its_association():
    api = PodIdentityApi()
    api.create_pod_identity_association(clusterName="c", namespace="ray", serviceAccount="raytrain-smoke",
                                        roleArn=SMOKE_ROLE)
    with pytest.raises(eks.KubectlError, match="raytrain-smoke"):
        eks.ensure_run_identity(api, cluster="c", namespace="ray", run="raytrain-smoke", role=RUN_ROLE,
                                say=lambda _: None)
    assert eks.release_run_identity(api, cluster="c", namespace="ray", run="raytrain-smoke", role=RUN_ROLE) == 0
    assert [a["roleArn"] for a in api.associations.values()] == [SMOKE_ROLE]
