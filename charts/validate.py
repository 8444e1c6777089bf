"""Validate manifests against the REAL KubeRay v1.7.0 CRD schemas, with unknown fields rejected.

    python -m charts.validate [DIR]      # every DIR/*.k8s.yaml (default dist); exit 1 on errors

The CRDs' openAPIV3Schema leaves ``additionalProperties`` unset, so a misspelled field passes a
plain JSON-schema check (the API server would prune it silently). :func:`strict` closes every
object that lists its properties, except where the CRD itself says
``x-kubernetes-preserve-unknown-fields``. The CEL rules (``x-kubernetes-validations``) are not
evaluated here; the targeted tests check the ones that matter to us.

Built-in kinds (the pod templates inside the RayCluster specs, lifted into ``v1/PodTemplate``)
are checked with kubernetes-validate's strict Kubernetes schema, at the spec's Kubernetes version.

Needs the ``dev`` extra (jsonschema, kubernetes-validate); imports no cdk8s.
"""
from __future__ import annotations

import argparse
import copy
import functools
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import kubernetes_validate
import yaml

CRD_FILE = Path(__file__).resolve().parent / "crds" / "kuberay-v1.7.0.yaml"
SERVED_VERSION = "v1"


def strict(schema: Any) -> Any:
    """A copy of ``schema`` where every object with ``properties`` refuses other keys."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=1)
def crd_schemas() -> dict[str, dict]:
    """kind -> openAPIV3Schema of the served version, as the CRD file has it."""
    schemas = {}
    for crd in yaml.load_all(CRD_FILE.read_text(encoding="utf-8"), Loader=yaml.CSafeLoader):
        if not crd:
            continue
        kind = crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version["name"] == SERVED_VERSION:
                schemas[kind] = version["schema"]["openAPIV3Schema"]
    return schemas


@functools.lru_cache(maxsize=None)
def validator(kind: str, strict_mode: bool = True) -> jsonschema.Draft7Validator:
    schema = crd_schemas()[kind]
    return jsonschema.Draft7Validator(strict(schema) if strict_mode else copy.deepcopy(schema))


def crd_errors(obj: dict, strict_mode: bool = True) -> list[str]:
    """Every schema violation of a RayCluster/RayJob, as ``path: message`` lines."""
    if obj.get("apiVersion") != f"ray.io/{SERVED_VERSION}":
        return [f"apiVersion: {obj.get('apiVersion')!r} is not ray.io/{SERVED_VERSION}"]
    found = validator(obj["kind"], strict_mode).iter_errors(obj)
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in found)


def pod_templates(obj: dict) -> Iterator[tuple[str, dict]]:
    """``(where, template)`` of every pod template inside a RayCluster or RayJob (head,
    worker groups, and a RayJob's submitter)."""
    spec = obj["spec"]
    if obj["kind"] == "RayJob" and "submitterPodTemplate" in spec:
        yield "spec.submitterPodTemplate", spec["submitterPodTemplate"]
    cluster = spec if obj["kind"] == "RayCluster" else spec.get("rayClusterSpec")
    if not cluster:
        return
    prefix = "spec" if obj["kind"] == "RayCluster" else "spec.rayClusterSpec"
    yield f"{prefix}.headGroupSpec.template", cluster["headGroupSpec"]["template"]
    for i, group in enumerate(cluster.get("workerGroupSpecs", [])):
        yield f"{prefix}.workerGroupSpecs[{i}].template", group["template"]


def pod_template_errors(obj: dict, kubernetes_version: str) -> list[str]:
    """Strict Kubernetes-schema errors of the pod templates (as v1/PodTemplate objects)."""
    errors = []
    for where, template in pod_templates(obj):
        lifted = {"apiVersion": "v1", "kind": "PodTemplate",
                  "metadata": {"name": obj["metadata"]["name"], "namespace": obj["metadata"].get("namespace", "default")},
                  "template": template}
        try:
            kubernetes_validate.validate(lifted, f"{kubernetes_version}.0", strict=True)
        except kubernetes_validate.ValidationError as err:
            errors.append(f"{where}: {str(err).splitlines()[0]}")
    return errors


def manifest_errors(directory: str | Path, kubernetes_version: str) -> tuple[int, list[str]]:
    """(objects checked, ``file: where: error`` lines) for every ``*.k8s.yaml`` in ``directory``."""
    checked, errors = 0, []
    for path in sorted(Path(directory).glob("*.k8s.yaml")):
        for obj in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not obj:
                continue
            checked += 1
            if obj.get("apiVersion", "").startswith("ray.io/"):
                errors += [f"{path.name}: {e}" for e in crd_errors(obj)]
                errors += [f"{path.name}: {e}" for e in pod_template_errors(obj, kubernetes_version)]
            else:
                try:
                    kubernetes_validate.validate(obj, f"{kubernetes_version}.0", strict=True)
                except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as err:
                    errors.append(f"{path.name}: {obj.get('kind')}: {str(err).splitlines()[0]}")
    return checked, errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m charts.validate", description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", default="dist")
    parser.add_argument("--env", default=os.environ.get("ENV_FILE", "environment.toml"),
                        help="the spec whose Kubernetes version the pods are checked against")
    args = parser.parse_args(argv)
    from environment import SpecError, load_environment

    try:
        version = load_environment(args.env).cluster.kubernetes_version
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    checked, errors = manifest_errors(args.directory, version)
    for line in errors:
        print(line)
    if not checked:
        print(f"error: no *.k8s.yaml in {args.directory} (run cdk8s synth first)", file=sys.stderr)
        return 2
    print(f"{checked} objects in {args.directory}: {'OK' if not errors else f'{len(errors)} errors'} "
          f"(KubeRay CRDs strict, Kubernetes {version} strict)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
