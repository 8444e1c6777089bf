"""app.py and the infrastructure-only refusals: one line on stderr, exit 2, nothing written."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from infra_variants import REPO, alternative_raw, default_raw
from toml_writer import toml_text

CDK = REPO / "node_modules" / ".bin" / "cdk"


def _env(**extra) -> dict:
    """This process's environment without AWS settings or ENV_FILE (which app.py reads before
    the context, and the Synth build sets), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "ENV_FILE"}
    env.update(CDK_DISABLE_CLI_TELEMETRY="true", JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20",
               PATH=f"{REPO / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}", **extra)
    return env


def test_kubernetes_version_without_a_kubectl_layer_is_refused_by_the_spec():
    # the versions the spec accepts ARE the kubectl layers of this app (one list, environment/contract.py)
    from environment import SpecError, environment_from_dict
    from infra.build import KUBECTL_LAYERS

    raw = default_raw()
    raw["cluster"]["kubernetes_version"] = "1.35"  # valid for EKS, no layer here
    with pytest.raises(SpecError) as err:
        environment_from_dict(raw, "k8s.toml")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("k8s.toml: cluster.kubernetes_version: '1.35' is not supported by this CDK app")
    assert f"supported: {', '.join(KUBECTL_LAYERS)}" in message


def test_app_prints_one_line_and_exits_2_before_any_output(tmp_path):
    # given the spec named by the CLI context (-c env=...), with a Kubernetes version that has
    # no kubectl layer here, app.py prints one line, exits 2 and writes nothing
    raw = default_raw()
    raw["cluster"]["kubernetes_version"] = "1.35"
    spec_file = tmp_path / "bad.toml"
    spec_file.write_text(toml_text(raw))
    outdir = tmp_path / "cdk.out"
    result = subprocess.run(
        [sys.executable, "app.py"], cwd=REPO, capture_output=True, text=True, timeout=120,
        env=_env(CDK_CONTEXT_JSON=json.dumps({"env": str(spec_file)}), CDK_OUTDIR=str(outdir)))
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {spec_file}: cluster.kubernetes_version: '1.35' is not supported by this CDK app")
    assert result.stdout == "" and not outdir.exists()


def test_an_az_outside_the_region_is_refused_with_one_line():
    from infra.build import build_app
    from environment import SpecError, environment_from_dict

    raw = default_raw()
    raw["cluster"]["gpu_availability_zone"] = raw["cluster"]["availability_zones"][1] = "us-west-2a"
    with pytest.raises(SpecError) as err:
        build_app(environment_from_dict(raw, "az.toml"))
    assert str(err.value).startswith("az.toml: cluster.availability_zones[1]: 'us-west-2a' is not an AZ of region us-east-1")


@pytest.mark.slow  # ~15-60 s: the real npm CLI runs app.py, which synthesizes every stack
@pytest.mark.skipif(not CDK.exists(), reason="npm CLIs not installed (make install)")
def test_cdk_cli_synth_offline_with_an_account(tmp_path):
    # given an account in the spec and no credentials or network, when the real CLI synthesizes,
    # then it needs no lookup (the AZ context comes from the spec) and writes every template
    spec_file = tmp_path / "account.toml"
    spec_file.write_text(toml_text(alternative_raw()))
    outdir = tmp_path / "cdk.out"
    workdir = tmp_path / "project"
    workdir.mkdir()
    for name in ("cdk.json",):
        shutil.copy(REPO / name, workdir / name)
    result = subprocess.run(
        [str(CDK), "synth", "--quiet", "-o", str(outdir),
         "--app", f"{sys.executable} {REPO / 'app.py'}"],
        cwd=workdir, capture_output=True, text=True, timeout=300,
        env=_env(ENV_FILE=str(spec_file), PYTHONPATH=str(REPO)))
    assert result.returncode == 0, result.stderr[-3000:]
    for stack in ("raytrain-network", "raytrain-storage", "raytrain-cluster"):
        assert (outdir / f"{stack}.template.json").exists()
    assert not (workdir / "cdk.context.json").exists()  # no lookup was needed
