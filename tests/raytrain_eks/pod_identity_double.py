"""A double of EKS's Pod Identity association API (moto 5 does not implement it): the three
operations ``raytrain_eks/backends/eks.py`` calls, each request validated against the
operation's input shape in botocore's own EKS service model (botocore 1.44.8,
``botocore/data/eks/2017-11-01/service-2.json``: ``CreatePodIdentityAssociation``,
``ListPodIdentityAssociations``, ``DeletePodIdentityAssociation``), and answered in its output
shape. What it models of EKS: one association per (cluster, namespace, service account) (EKS
refuses a second with ``ResourceInUseException``), listing filtered by namespace and service
account, deletion by id (``ResourceNotFoundException`` for an unknown one)."""
from __future__ import annotations

import itertools

import botocore.session
from botocore.exceptions import ClientError
from botocore.validate import validate_parameters

_MODEL = botocore.session.get_session().get_service_model("eks")


def _validated(operation: str, params: dict) -> None:
    validate_parameters(params, _MODEL.operation_model(operation).input_shape)


class PodIdentityApi:
    def __init__(self) -> None:
        self.associations: dict[str, dict] = {}
        self.calls: list[tuple[str, dict]] = []
        self._ids = itertools.count(1)

    def create_pod_identity_association(self, **params) -> dict:
        _validated("CreatePodIdentityAssociation", params)
        self.calls.append(("create", params))
        key = (params["clusterName"], params["namespace"], params["serviceAccount"])
        if any((a["clusterName"], a["namespace"], a["serviceAccount"]) == key for a in self.associations.values()):
            raise ClientError({"Error": {"Code": "ResourceInUseException", "Message": "exists"}},
                              "CreatePodIdentityAssociation")
        association_id = f"a-{next(self._ids):017d}"
        self.associations[association_id] = {**params, "associationId": association_id}
        return {"association": dict(self.associations[association_id])}

    def list_pod_identity_associations(self, **params) -> dict:
        _validated("ListPodIdentityAssociations", params)
        found = [{k: a[k] for k in ("clusterName", "namespace", "serviceAccount", "associationId")}
                 for a in self.associations.values() if a["clusterName"] == params["clusterName"]
                 and a["namespace"] == params.get("namespace", a["namespace"])
                 and a["serviceAccount"] == params.get("serviceAccount", a["serviceAccount"])]
        return {"associations": found}

    def delete_pod_identity_association(self, **params) -> dict:
        _validated("DeletePodIdentityAssociation", params)
        self.calls.append(("delete", params))
        if params["associationId"] not in self.associations:
            raise ClientError({"Error": {"Code": "ResourceNotFoundException", "Message": "gone"}},
                              "DeletePodIdentityAssociation")
        return {"association": self.associations.pop(params["associationId"])}
