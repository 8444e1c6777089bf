"""The watcher Lambda as Lambda runs it: the asset folder exactly as synth stages it, its handler
called the way AWS's runtime interface client calls it, in a venv that holds only what the Lambda
Python runtime provides (the standard library and boto3) and not this project. moto's server
stands in for SSM, DynamoDB and CodePipeline; the digest comes from the real local registry.

Before the staging by imports (infra/stacks/pipeline_watcher.py), the asset carried ``image_watcher/`` and ``environment/`` by a
hand-written list; ``environment`` imports ``spec_schema``, so the handler died at import with
``ModuleNotFoundError: No module named 'spec_schema'`` (the old test imported it with
``python -I``, which still reads the editable install).
"""
from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import boto3
import pytest

from fixtures_pipeline import create_watcher_resources
from bare_runtime import LAMBDA_RUNTIME, distribution_closure, importable_names, invoke_lambda, make_runtime, \
    visible_project_packages
from infra.lambdas.image_watcher.watcher import WatcherConfig
from infra.stacks.pipeline_watcher import FUNCTION_DIR, LAMBDA_RUNTIME_PACKAGES, WATCH_HANDLER, UnshippableImport, \
    first_party_packages, stage_asset, stage_function

NAME = "deep-learning-containers/ray"


@pytest.fixture(scope="module")
def lambda_python(tmp_path_factory) -> Path:
    python = make_runtime(tmp_path_factory.mktemp("lambda-runtime") / "venv", LAMBDA_RUNTIME)
    # the runtime is bare: from a folder outside the repository, none of the project is importable
    assert visible_project_packages(python, cwd=tmp_path_factory.mktemp("elsewhere")) == []
    return python


def test_the_runtime_packages_the_asset_may_rely_on_are_exactly_boto3_and_its_dependencies():
    provided = set().union(*(importable_names(d) for d in distribution_closure(LAMBDA_RUNTIME)))
    assert provided == LAMBDA_RUNTIME_PACKAGES


def test_the_watcher_asset_carries_every_repository_package_its_handler_imports(tmp_path):
    staged = stage_asset(tmp_path)
    assert sorted(p.name for p in staged.iterdir()) == ["environment", "image_watcher", "spec_schema"]
    registry = FUNCTION_DIR / "registry.py"  # the same registry client the `lock` command uses
    assert (staged / "image_watcher" / "registry.py").read_bytes() == registry.read_bytes()


def test_the_staged_watcher_starts_the_pipeline_for_a_new_digest_in_a_bare_lambda_runtime(
        lambda_python, aws, registry, tmp_path):
    # given the stack's resources (as test_image_watcher.py's world makes them) and a new digest on the tag
    suffix = uuid.uuid4().hex[:8]
    config = WatcherConfig(repository=f"{registry.host}/{NAME}", tag=f"asset-{suffix}",
                           parameter_name=f"/raytrain/asset-{suffix}/promoted-digest",
                           table_name=f"history-{suffix}", pipeline_name=f"redeploy-{suffix}")
    create_watcher_resources(aws, config)
    digest = registry.push_image(NAME, config.tag, content=f"{suffix}\n".encode())
    # the function's environment as WatcherFunctions sets it, plus what Lambda adds (region, credentials)
    environ = {"IMAGE_REPOSITORY": config.repository, "IMAGE_TAG": config.tag,
               "PROMOTED_DIGEST_PARAMETER": config.parameter_name, "HISTORY_TABLE": config.table_name,
               "PIPELINE_NAME": config.pipeline_name, "AWS_REGION": aws["region_name"],
               # parsed on every start (environment/rules.py parse_window): the window's code runs in
               # the bare runtime too; with no history yet, whether it is open decides nothing
               "MAINTENANCE_WINDOW": "sat,sun 02:00-06:00",
               "AWS_DEFAULT_REGION": aws["region_name"], "AWS_ACCESS_KEY_ID": aws["aws_access_key_id"],
               "AWS_SECRET_ACCESS_KEY": aws["aws_secret_access_key"], "AWS_ENDPOINT_URL": aws["endpoint_url"]}
    # when the runtime invokes the handler from the staged folder
    done = invoke_lambda(lambda_python, stage_asset(tmp_path), WATCH_HANDLER, {"source": "aws.events"}, environ)
    # then it imported, resolved the digest and started one execution carrying it
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["action"], result["current"]) == ("start", digest)
    execution = boto3.client("codepipeline", **aws).get_pipeline_execution(pipelineName=config.pipeline_name, pipelineExecutionId=result["execution_id"])
    assert execution["pipelineExecution"]["variables"] == [{"name": "IMAGE_DIGEST", "resolvedValue": digest}]


def _function(tmp_path: Path, handler: str, **modules: str) -> Path:
    """A function package ``fn`` with ``handler.py`` (and sibling top-level modules) under tmp_path."""
    function = tmp_path / "fn"
    function.mkdir()
    (function / "__init__.py").write_text("")
    (function / "handler.py").write_text(textwrap.dedent(handler))
    for name, text in modules.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    return function


def test_an_import_that_no_runtime_provides_fails_the_synth_naming_it(tmp_path):
    function = _function(tmp_path, """
        import json
        from environment.contract import DIGEST_PATTERN

        def handle(event, context):
            import yaml  # not in the Lambda runtime
            return yaml.safe_dump(event)
    """)
    with pytest.raises(UnshippableImport, match=r"fn\.handler imports 'yaml'"):
        stage_function(function, ["fn.handler"], tmp_path / "out")
    (function / "handler.py").write_text("from environment.contract import DIGEST_PATTERN\nimport boto3, json\n")
    assert list(first_party_packages(function, ["fn.handler"])) == ["environment", "spec_schema"]


def test_a_module_the_runtimes_newer_python_removed_fails_the_synth(tmp_path):
    # cgi left the standard library in Python 3.13 (PEP 594); this machine's 3.11 still has it
    function = _function(tmp_path, "import cgi\n")
    with pytest.raises(UnshippableImport, match="imports 'cgi'"):
        first_party_packages(function, ["fn.handler"])


def test_an_import_by_a_string_fails_the_synth(tmp_path):
    function = _function(tmp_path, "import importlib\nCONTRACT = importlib.import_module('environment.contract')\n")
    with pytest.raises(UnshippableImport, match="fn.handler line 2 imports by a string"):
        first_party_packages(function, ["fn.handler"])


def test_a_sibling_module_ships_from_where_it_lives_readable_by_the_runtime_user(tmp_path):
    function = _function(tmp_path, "from shared import VALUE\n", shared="VALUE = 1\n")
    (tmp_path / "shared.py").chmod(0o600)  # as a `umask 077` checkout leaves it
    staged = stage_function(function, ["fn.handler"], tmp_path / "out")
    assert sorted(p.name for p in staged.iterdir()) == ["fn", "shared.py"]
    assert all(p.stat().st_mode & 0o444 == 0o444 for p in staged.rglob("*"))


def test_the_asset_folder_outlives_the_synth_when_asset_staging_is_off(tmp_path):
    # With staging disabled (`cdk synth --no-staging`, SAM local) CDK points the asset at its
    # source folder itself (aws-cdk-lib 2.275 core/lib/asset-staging.js, stageByCopying): that
    # folder must be part of the cloud assembly, not a temporary one removed at exit.
    import aws_cdk as cdk
    from aws_cdk import aws_dynamodb as dynamodb, aws_ssm as ssm

    from infra.stacks.pipeline_watcher import WatcherFunctions

    app = cdk.App(outdir=str(tmp_path / "cdk.out"), context={"aws:cdk:disable-asset-staging": True})
    stack = cdk.Stack(app, "Watcher", env=cdk.Environment(account="111111111111", region="us-east-1"))
    table = dynamodb.Table(stack, "History", partition_key=dynamodb.Attribute(
        name="image", type=dynamodb.AttributeType.STRING))
    WatcherFunctions(stack, "Fns", image_repository="public.ecr.aws/x/ray", image_tag="t",
                     parameter=ssm.StringParameter(stack, "Promoted", string_value="none"), table=table,
                     pipeline_arn="arn:aws:codepipeline:us-east-1:111111111111:p", pipeline_name="p",
                     max_attempts=3, maintenance_window="")
    assembly = app.synth()
    manifest = json.loads(Path(assembly.directory, "Watcher.assets.json").read_text())
    sources = [Path(entry["source"]["path"]) for entry in manifest["files"].values() if entry["source"].get("path")]
    code = [s if s.is_absolute() else Path(assembly.directory) / s for s in sources]
    assert code and all(path.is_relative_to(Path(assembly.directory)) and (path / "image_watcher").is_dir()
                        for path in code if not path.name.endswith(".json"))
