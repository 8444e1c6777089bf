"""Cluster stack: control plane settings cdk-nag cannot see, node groups, EFA launch template,
add-ons at the spec's versions, and the Ray service account's Pod Identity."""
from __future__ import annotations

import json

from aws_cdk.assertions import Match

from environment.contract import (EFA_LABEL, GPU_ACCELERATOR_LABEL, GPU_TAINT_KEY, NODE_ROLE_LABEL, ON_CLUSTER_FOLDER,
                                  SMOKE_SERVICE_ACCOUNT)


def _one(synth, type_name: str) -> dict:
    [resource] = synth.resources("cluster", type_name).values()
    return resource["Properties"]


def _gpu_nodegroups(synth) -> dict[str, dict]:
    """GPU node group name (from the spec) -> properties."""
    groups = {}
    for resource in synth.resources("cluster", "AWS::EKS::Nodegroup").values():
        props = resource["Properties"]
        if props["AmiType"] == "AL2023_x86_64_NVIDIA":
            groups[props["Labels"]["raytrain.io/node-group"]] = props
    return groups


def _launch_template(synth, nodegroup: dict) -> dict:
    logical_id = nodegroup["LaunchTemplate"]["Id"]["Ref"]
    return synth.json("cluster")["Resources"][logical_id]["Properties"]["LaunchTemplateData"]


def test_cluster_version_auth_logging_endpoint(default):
    # cdk-nag's EKS rules do not see aws_eks_v2's cluster: assert these here.
    props = _one(default, "AWS::EKS::Cluster")
    assert props["Name"] == default.env.cluster.name
    assert props["Version"] == default.env.cluster.kubernetes_version
    assert props["AccessConfig"]["AuthenticationMode"] == "API"
    assert {t["Type"] for t in props["Logging"]["ClusterLogging"]["EnabledTypes"]} == {
        "api", "audit", "authenticator", "controllerManager", "scheduler"}
    assert default.env.cluster.endpoint_access == "public_and_private"
    vpc_config = props["ResourcesVpcConfig"]
    assert (vpc_config["EndpointPublicAccess"], vpc_config["EndpointPrivateAccess"]) == (True, True)
    assert props["ComputeConfig"] == {"Enabled": False}  # managed node groups, not Auto Mode


def test_private_endpoint_from_the_spec(alternative):
    vpc_config = _one(alternative, "AWS::EKS::Cluster")["ResourcesVpcConfig"]
    assert (vpc_config["EndpointPublicAccess"], vpc_config["EndpointPrivateAccess"]) == (False, True)
    # the kubectl provider then runs inside the VPC to reach the private endpoint
    handler = [r["Properties"] for r in alternative.resources("cluster", "AWS::Lambda::Function").values()
               if "VpcConfig" in r["Properties"]]
    assert handler


def test_admin_principals_get_cluster_admin_access_entries(alternative):
    entries = [e["Properties"] for e in alternative.resources("cluster", "AWS::EKS::AccessEntry").values()]
    [admin] = [e for e in entries if e["PrincipalArn"] == alternative.env.cluster.admin_principal_arns[0]]
    assert admin["AccessPolicies"][0]["AccessScope"] == {"Type": "cluster"}
    assert json.dumps(admin["AccessPolicies"][0]["PolicyArn"]).endswith('AmazonEKSClusterAdminPolicy"]]}')


def test_people_who_only_submit_get_the_ray_namespace_and_the_queue_not_cluster_admin(alternative, default):
    from environment.contract import SUBMITTERS_GROUP
    from infra.constructs.submitter_access import SUBMITTER_RULES

    entries = [e["Properties"] for e in alternative.resources("cluster", "AWS::EKS::AccessEntry").values()]
    [submitter] = [e for e in entries if e["PrincipalArn"] == alternative.env.cluster.submitter_principal_arns[0]]
    assert submitter["Type"] == "STANDARD" and submitter["KubernetesGroups"] == [SUBMITTERS_GROUP]
    assert "AccessPolicies" not in submitter  # no EKS access policy: RBAC in one namespace only
    assert not [e for e in default.resources("cluster", "AWS::EKS::AccessEntry").values()
                if e["Properties"].get("KubernetesGroups") == [SUBMITTERS_GROUP]]
    manifests = [json.loads(r["Properties"]["Manifest"]) for r in
                 alternative.resources("cluster", "Custom::AWSCDK-EKS-KubernetesResource").values()
                 if SUBMITTERS_GROUP in r["Properties"]["Manifest"]]
    [[role, binding]] = manifests
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == alternative.env.ray.namespace
    assert role["rules"] == SUBMITTER_RULES and binding["subjects"][0]["name"] == SUBMITTERS_GROUP
    granted = {(g, r) for rule in SUBMITTER_RULES for g in rule["apiGroups"] for r in rule["resources"]}
    assert ("", "secrets") not in granted and ("", "pods/exec") not in granted
    assert ("kueue.x-k8s.io", "localqueues") in granted and ("ray.io", "rayjobs") in granted


def test_people_who_only_submit_cannot_change_or_delete_a_network_policy():
    """The namespace's default-deny policy and every run's allow policy live in the Ray namespace
    beside the runs. RBAC's resourceNames cannot bound a create (the name is not known at
    authorization, Kubernetes "Using RBAC Authorization": create cannot be restricted by resource
    name), and a policy's name is the run's, so a submitter who may patch or delete one may
    patch or delete them all, the default deny included. Submit only creates its run's policy
    when missing (kubectl create); stop leaves it (it selects that RayJob's pods only)."""
    from infra.constructs.submitter_access import SUBMITTER_RULES

    verbs = {v for rule in SUBMITTER_RULES if "networkpolicies" in rule["resources"] for v in rule["verbs"]}
    assert verbs == {"get", "list", "create"}


def test_kubectl_layer_matches_the_kubernetes_version(default):
    layers = default.resources("cluster", "AWS::Lambda::LayerVersion")
    assert any("kubectl" in json.dumps(layer["Properties"]).lower() for layer in layers.values())
    handler = [r["Properties"] for r in default.resources("cluster", "AWS::Lambda::Function").values()
               if len(r["Properties"].get("Layers", [])) >= 2]
    assert handler, "the kubectl handler has the kubectl and AWS CLI layers"


def test_system_node_group(default):
    system = [r["Properties"] for r in default.resources("cluster", "AWS::EKS::Nodegroup").values()
              if r["Properties"]["AmiType"] == "AL2023_x86_64_STANDARD"]
    [props] = system
    spec = default.env.system_node_group
    assert props["InstanceTypes"] == [spec.instance_type]
    assert props["ScalingConfig"] == {"MinSize": spec.nodes, "DesiredSize": spec.nodes, "MaxSize": spec.nodes}
    assert props["Labels"][NODE_ROLE_LABEL] == "system"
    assert "Taints" not in props


def test_gpu_node_group_from_the_spec(default):
    [group] = default.env.gpu_node_groups
    props = _gpu_nodegroups(default)[group.name]
    assert props["InstanceTypes"] == ["g6.12xlarge"] == [group.instance_type]
    # scale to zero; a first deploy creates it with all three (tests/infra/test_update_oracle.py: later ones omit it)
    assert props["ScalingConfig"] == {"MinSize": 0, "MaxSize": 2, "DesiredSize": 0}
    assert props["CapacityType"] == "ON_DEMAND"
    assert props["Taints"] == [{"Key": GPU_TAINT_KEY, "Value": "true", "Effect": "NO_SCHEDULE"}]
    assert props["Labels"] == {**group.labels, GPU_ACCELERATOR_LABEL: "nvidia-l4"} and props["Labels"][EFA_LABEL] == "true"
    assert {k: v for k, v in props["Tags"].items() if k.startswith("raytrain:")} == {
        "raytrain:gpus-per-node": "4", "raytrain:efa-per-node": "1", "raytrain:gpu-node-group": "gpu",
        "raytrain:creation-key": f"g6.12xlarge/on-demand/{default.env.cluster.gpu_availability_zone}/"
                                 f"{'.'.join(default.env.cluster.availability_zones)}/AL2023_x86_64_NVIDIA"}
    assert "DiskSize" not in props  # the launch template's gp3 volume is the root disk


def test_gpu_nodes_carry_the_autoscalers_gpu_label_also_at_zero_nodes(variant):
    # cluster-autoscaler's AWS provider (cloudprovider/aws/aws_cloud_provider.go GPULabel) knows
    # a GPU node by this label; a 0-node group's template takes it from the node-template tags
    for props in _gpu_nodegroups(variant).values():
        value = props["Labels"][GPU_ACCELERATOR_LABEL]
        assert value.startswith("nvidia-")
        assert props["Tags"][f"k8s.io/cluster-autoscaler/node-template/label/{GPU_ACCELERATOR_LABEL}"] == value


def test_efa_launch_template(default):
    [group] = default.env.gpu_node_groups
    data = _launch_template(default, _gpu_nodegroups(default)[group.name])
    [interface] = data["NetworkInterfaces"]
    assert interface["InterfaceType"] == "efa"
    assert (interface["DeviceIndex"], interface["NetworkCardIndex"]) == (0, 0)
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    [root] = data["BlockDeviceMappings"]
    assert root == {"DeviceName": "/dev/xvda", "Ebs": {
        "VolumeSize": group.root_volume_gib, "VolumeType": "gp3", "Encrypted": True,
        "DeleteOnTermination": True}}
    assert "ImageId" not in data  # the managed node group's AMI type supplies it
    assert "CapacityReservationSpecification" not in data and "InstanceMarketOptions" not in data


def test_cluster_placement_group(default):
    [group] = default.env.gpu_node_groups
    data = _launch_template(default, _gpu_nodegroups(default)[group.name])
    placement_id = data["Placement"]["GroupName"]["Fn::GetAtt"][0]
    placement = default.json("cluster")["Resources"][placement_id]
    assert placement["Type"] == "AWS::EC2::PlacementGroup"
    assert placement["Properties"] == {"Strategy": "cluster"}


def test_efa_security_group_allows_all_traffic_to_and_from_itself_only(default):
    [(sg_id, sg)] = [(k, v) for k, v in default.resources("cluster", "AWS::EC2::SecurityGroup").items()
                     if "EFA" in v["Properties"]["GroupDescription"]]
    assert "SecurityGroupIngress" not in sg["Properties"]
    # allow_all_outbound=False leaves CDK's placeholder "disallow" rule only
    assert all(rule.get("CidrIp") == "255.255.255.255/32"
               for rule in sg["Properties"].get("SecurityGroupEgress", []))
    self_ref = {"Fn::GetAtt": [sg_id, "GroupId"]}
    [ingress] = default.resources("cluster", "AWS::EC2::SecurityGroupIngress").values()
    [egress] = default.resources("cluster", "AWS::EC2::SecurityGroupEgress").values()
    assert ingress["Properties"]["GroupId"] == self_ref == ingress["Properties"]["SourceSecurityGroupId"]
    assert egress["Properties"]["GroupId"] == self_ref == egress["Properties"]["DestinationSecurityGroupId"]
    assert ingress["Properties"]["IpProtocol"] == egress["Properties"]["IpProtocol"] == "-1"
    # and the EFA interface carries both the EFA group and the cluster security group
    [group] = default.env.gpu_node_groups
    [interface] = _launch_template(default, _gpu_nodegroups(default)[group.name])["NetworkInterfaces"]
    assert self_ref in interface["Groups"]
    assert {"Fn::GetAtt": [_cluster_id(default), "ClusterSecurityGroupId"]} in interface["Groups"]


def _cluster_id(synth) -> str:
    [logical_id] = synth.resources("cluster", "AWS::EKS::Cluster")
    return logical_id


def _charts(synth) -> dict[str, dict]:
    return {r["Properties"]["Chart"]: r["Properties"]  # charts from a repository (not the CRD charts)
            for r in synth.resources("cluster", "Custom::AWSCDK-EKS-HelmChart").values() if "Chart" in r["Properties"]}


def test_helm_chart_versions_equal_the_spec(variant):
    charts = _charts(variant)
    versions = variant.env.versions
    expected = {
        "nvidia-device-plugin": versions.nvidia_device_plugin,
        "aws-efa-k8s-device-plugin": versions.efa_device_plugin,
        "kuberay-operator": versions.kuberay_operator,
        "cluster-autoscaler": versions.cluster_autoscaler,
    }
    if variant.env.observability.enabled:  # the default; the alternative variant turns it off
        expected.update({"kube-prometheus-stack": versions.kube_prometheus_stack,
                         "dcgm-exporter": versions.dcgm_exporter})
    if variant.env.queueing.enabled:
        expected["kueue"] = versions.chart("kueue")
    assert {name: c["Version"] for name, c in charts.items()} == expected


def test_device_plugins_tolerate_the_gpu_taint_and_select_gpu_nodes(variant):
    charts = _charts(variant)
    toleration = {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
    efa = json.loads(charts["aws-efa-k8s-device-plugin"]["Values"])
    assert efa["tolerations"] == [toleration]
    assert efa["nodeSelector"] == {EFA_LABEL: "true"}
    assert efa["supportedInstanceLabels"]["values"] == sorted(
        {g.instance_type for g in variant.env.gpu_node_groups})
    nvidia = json.loads(charts["nvidia-device-plugin"]["Values"])
    assert nvidia["tolerations"] == [toleration]
    [term] = nvidia["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": NODE_ROLE_LABEL, "operator": "In", "values": ["gpu"]}]


def test_kuberay_operator_on_system_nodes(default):
    kuberay = _charts(default)["kuberay-operator"]
    values = json.loads(kuberay["Values"])
    assert values["nodeSelector"] == {NODE_ROLE_LABEL: "system"}
    # explicit requests: the scheduling-fit check counts exactly these
    assert values["resources"]["requests"] == {"cpu": "100m", "memory": "512Mi"}
    assert kuberay["Repository"] == "https://ray-project.github.io/kuberay-helm/"


def test_ray_namespace_service_account_and_pod_identity(variant):
    ray = variant.env.ray
    manifests = [json.loads(r["Properties"]["Manifest"]) if isinstance(r["Properties"]["Manifest"], str)
                 else r["Properties"]["Manifest"]
                 for r in variant.resources("cluster", "Custom::AWSCDK-EKS-KubernetesResource").values()]
    flat = [m for doc in manifests for m in (doc if isinstance(doc, list) else [doc])]
    kinds = {(m["kind"], m["metadata"]["name"]) for m in flat if isinstance(m, dict) and "kind" in m}
    assert ("Namespace", ray.namespace) in kinds
    assert ("ServiceAccount", ray.service_account) in kinds
    accounts = [m for m in flat if m.get("kind") == "ServiceAccount"]
    assert sorted(a["metadata"]["name"] for a in accounts) == sorted([ray.service_account, SMOKE_SERVICE_ACCOUNT])
    for account in accounts:
        assert account["metadata"]["namespace"] == ray.namespace and account["automountServiceAccountToken"] is False
        # no IRSA annotation: its web-identity token would shadow Pod Identity in the SDKs
        assert "eks.amazonaws.com/role-arn" not in account["metadata"].get("annotations", {})
    associations = {a["Properties"]["ServiceAccount"]: a["Properties"]
                    for a in variant.resources("cluster", "AWS::EKS::PodIdentityAssociation").values()
                    if a["Properties"]["Namespace"] == ray.namespace}
    # the long-lived cluster's and the smoke runs'; each run's own is made by submit
    assert set(associations) == {ray.service_account, SMOKE_SERVICE_ACCOUNT}
    assert associations[ray.service_account]["RoleArn"] == {"Fn::GetAtt": [_pod_role_id(variant), "Arn"]}
    assert associations[SMOKE_SERVICE_ACCOUNT]["RoleArn"] == {"Fn::GetAtt": [_output_role_id(variant, "SmokeRoleArn"), "Arn"]}
    # the pod-identity agent add-on, exactly once (a second one fails CloudFormation, E3019)
    addons = [a["Properties"]["AddonName"] for a in variant.resources("cluster", "AWS::EKS::Addon").values()]
    assert addons.count("eks-pod-identity-agent") == 1


def _pod_role_id(synth) -> str:
    return synth.json("cluster")["Outputs"]["PodRoleArn"]["Value"]["Fn::GetAtt"][0]


def test_pod_roles_trust_only_pod_identity_of_this_clusters_ray_namespace(default):
    for output in ("PodRoleArn", "RunRoleArn", "SmokeRoleArn"):
        role = default.json("cluster")["Resources"][_output_role_id(default, output)]["Properties"]
        [statement] = role["AssumeRolePolicyDocument"]["Statement"]
        assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
        assert sorted(statement["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
        tags = statement["Condition"]["StringEquals"]
        assert tags["aws:RequestTag/kubernetes-namespace"] == default.env.ray.namespace
        assert tags["aws:RequestTag/eks-cluster-arn"]["Fn::Join"][1][-1] == f":cluster/{default.env.cluster.eks_name}"
        assert "ManagedPolicyArns" not in role


def _output_role_id(synth, output: str) -> str:
    return synth.json("cluster")["Outputs"][output]["Value"]["Fn::GetAtt"][0]


def _statements(synth, output: str) -> dict:
    role = {"Ref": _output_role_id(synth, output)}
    [policy] = [p["Properties"] for p in synth.resources("cluster", "AWS::IAM::Policy").values()
                if role in p["Properties"]["Roles"]]  # nothing else is attached to a pod role
    text = json.dumps(policy)
    assert '"s3:*"' not in text and '"Resource": "*"' not in text
    return {s["Sid"]: s for s in policy["PolicyDocument"]["Statement"]}


def test_pod_policies_are_least_privilege(variant):
    """The statements as written (what each grants is judged by IAM's rules in test_run_isolation.py)."""
    env = variant.env
    bucket, prefix = env.bucket_name, env.storage.prefix
    arn = lambda suffix: {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, f":s3:::{bucket}{suffix}"]]}  # noqa: E731
    # every statement: only for a bucket of this account, never a same-named one elsewhere
    owned = {"StringEquals": {"s3:ResourceAccount": env.cluster.account or {"Ref": "AWS::AccountId"}}}
    actions = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
    reads = {"Sid": "ReadJobInputs", "Effect": "Allow", "Action": "s3:GetObject", "Condition": owned,
             "Resource": [arn(f"/{ro}/*") for ro in env.storage.read_only_prefixes] + [arn(f"/{prefix}/_inputs/*")]}
    # HeadBucket needs s3:ListBucket with no prefix: unconditioned, but on this one bucket only
    listing = {"Sid": "ListCheckpointBucket", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": arn(""),
               "Condition": owned}
    tracking = ({"TrackingServer": {"Sid": "TrackingServer", "Effect": "Allow", "Action": "sagemaker-mlflow:*",
                                    "Resource": env.ray.mlflow_tracking_server_arn}}
                if env.ray.mlflow_tracking_server_arn else {})
    run = _statements(variant, "RunRoleArn")
    # every role that writes runs is denied the pipeline's evidence and the uploaded inputs
    # explicitly (a run named like a smoke run: tests/infra/test_run_isolation.py)
    never = run.pop("NeverPipelineEvidenceOrInputs")
    assert never["Effect"] == "Deny" and sorted(never["Action"]) == ["s3:DeleteObject", "s3:PutObject"]
    assert run == {"OwnRunObjects": {"Sid": "OwnRunObjects", "Effect": "Allow", "Action": actions, "Condition": owned,
                                     "Resource": arn(f"/{prefix}/${{aws:PrincipalTag/kubernetes-service-account}}/*")},
                   "ReadJobInputs": reads, "ListCheckpointBucket": listing, **tracking}
    smoke = _statements(variant, "SmokeRoleArn")
    assert smoke == {"SmokeRunObjects": {"Sid": "SmokeRunObjects", "Effect": "Allow", "Action": actions,
                                         "Condition": owned, "Resource": arn(f"/{prefix}/smoke-*")},
                     "ReadJobInputs": reads, "ListCheckpointBucket": listing, **tracking}
    # the long-lived cluster's role: only the runs it holds (runs/on-cluster_<run>/), never another
    # run's folder (a service account name cannot hold "_": docs/security.md)
    shared = _statements(variant, "PodRoleArn")
    assert shared == {
        "OnClusterRunObjects": {"Sid": "OnClusterRunObjects", "Effect": "Allow", "Action": actions, "Condition": owned,
                                "Resource": arn(f"/{prefix}/{ON_CLUSTER_FOLDER}*")},
        "NeverPipelineEvidenceOrInputs": {"Sid": "NeverPipelineEvidenceOrInputs", "Effect": "Deny",
                                          "Action": ["s3:PutObject", "s3:DeleteObject"],
                                          "Resource": [arn(f"/{prefix}/smoke-*"), arn(f"/{prefix}/_inputs/*")]},
        "ReadJobInputs": reads, "ListCheckpointBucket": listing, **tracking}


def test_outputs(default):
    outputs = default.json("cluster")["Outputs"]
    assert outputs["ClusterName"]["Value"] == {"Ref": _cluster_id(default)}
    assert outputs["UpdateKubeconfigCommand"]["Value"] == (
        "aws eks update-kubeconfig --name raytrain --region us-east-1")
    assert outputs["PodRoleArn"]["Value"]["Fn::GetAtt"][1] == "Arn"


def test_stack_attributes_other_code_uses(default):
    cluster = default.built.cluster
    assert cluster.service_account_name == default.env.ray.service_account
    assert cluster.service_account_namespace == default.env.ray.namespace
    assert len(cluster.gpu_nodegroups) == len(default.env.gpu_node_groups)
    assert cluster.pod_role is not None and default.built.storage.bucket is not None
    assert default.built.pipeline is None
    assert default.built.cluster.stack_name == "raytrain-cluster"


def test_gpu_node_groups_replace_nodes_old_first_on_a_version_update(variant):
    """EKS API reference, NodegroupUpdateConfig.updateStrategy
    (https://docs.aws.amazon.com/eks/latest/APIReference/API_NodegroupUpdateConfig.html): "The
    default strategy ... launches the new instances first, before terminating the old instances.
    The minimal strategy ... terminates the old instances before launching the new instances ...
    useful ... with hardware accelerators such as GPUs"; maxUnavailable or its percentage "is
    required to have a value". EKS Capacity Blocks guide
    (https://docs.aws.amazon.com/eks/latest/userguide/capacity-blocks-mng.html): when upgrading a
    node group with Capacity Blocks the desired size must be 0, since there is no slot for a new
    instance. aws-eks-v2/lib/managed-nodegroup.js writes no UpdateConfig unless maxUnavailable is
    given, so a GPU group would get the surge-first DEFAULT: a new launch template version then
    cannot launch in a reservation the group fills, and the update fails."""
    for name, props in _gpu_nodegroups(variant).items():
        assert props.get("UpdateConfig") == {"MaxUnavailable": 1, "UpdateStrategy": "MINIMAL"}, name
