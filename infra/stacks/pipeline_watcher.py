"""The watcher Lambda of the redeploy pipeline (code in infra/lambdas/image_watcher/) with a
least-privilege role: it may touch exactly the parameter, table and pipeline it needs. (Promotion
is a CodeBuild step, raytrain_eks/pipeline/apply_promote.py: a failure after Apply must roll the
cluster back, which needs kubectl.)

The asset holds ``image_watcher/`` (with the registry client the ``lock`` command also uses) and
the repository packages it imports (``environment`` for the digest format, and what that imports),
found by following the imports at synth time (:func:`stage_function`): no copy lives in the repository.

A list of packages written by hand went stale once already: ``environment`` started importing
``spec_schema``, the asset did not carry it, and every run of the function ended in
``ModuleNotFoundError``. Here the import statements decide (``modulefinder`` reads them without
running the code, nested and relative imports included, every branch of an ``if``/``try``). The
synth fails, naming the module and the file that imports it, on an import that neither this
repository, the runtime's standard library nor the runtime's boto3 provides, and on an import by
a string (``importlib.import_module``, ``__import__``), which no reading of the code can follow.
"""
from __future__ import annotations

import ast
import modulefinder
import shutil
import sys
from pathlib import Path

from aws_cdk import Duration, RemovalPolicy, Stage, aws_dynamodb as dynamodb, aws_iam as iam
from aws_cdk import aws_lambda as lambda_, aws_logs as logs, aws_ssm as ssm
from constructs import Construct

from infra.lambdas.image_watcher.registry import REQUEST_TIMEOUT_S

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNTIME = lambda_.Runtime.PYTHON_3_14
"""The newest Lambda Python (cdk-nag L1); the code is valid on 3.11+."""


# --- Staging a Python Lambda asset (the module docstring says why) ---------------------------

LAMBDA_RUNTIME_PACKAGES = frozenset({"boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six"})
"""What AWS's Python runtimes ship beside the standard library: the AWS SDK and its dependencies."""
REMOVED_FROM_THE_STANDARD_LIBRARY = frozenset({
    # Python 3.12 (What's New in Python 3.12, "Removed")
    "distutils", "imp", "asynchat", "asyncore", "smtpd",
    # Python 3.13 (PEP 594, the "dead batteries")
    "aifc", "audioop", "cgi", "cgitb", "chunk", "crypt", "imghdr", "mailcap", "msilib", "nis", "nntplib",
    "ossaudiodev", "pipes", "sndhdr", "spwd", "sunau", "telnetlib", "uu", "xdrlib", "lib2to3",
})
"""Modules of this machine's Python 3.11 that the Lambda runtime's newer Python no longer has: the
synth runs on 3.11, the function on the runtime's version (:data:`RUNTIME`)."""
_STRING_IMPORTS = {"import_module", "__import__"}


class UnshippableImport(ImportError):
    """A function imports something its asset cannot carry: a bug of this repository, found at synth."""


def _runtime_standard_library() -> frozenset[str]:
    return frozenset(sys.stdlib_module_names) - REMOVED_FROM_THE_STANDARD_LIBRARY


def _string_import(path: Path) -> int | None:
    """The line of the first import by a string in a module, if any."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name in _STRING_IMPORTS:
                return node.lineno
    return None


def first_party_packages(function_dir: Path, entry_modules: list[str]) -> dict[str, Path]:
    """The repository packages (top-level name -> folder) that the entry modules (``function_dir``'s,
    named as the runtime imports them) need, directly or through each other, ``function_dir``
    itself excluded. Raises :class:`UnshippableImport` when a module cannot be shipped."""
    finder = modulefinder.ModuleFinder(path=[str(function_dir.parent), str(REPO_ROOT)])
    for module in entry_modules:
        finder.import_hook(module)
    packages: dict[str, Path] = {}
    for name, module in finder.modules.items():
        if not module.__file__:  # a built-in module; the finder's path holds only our folders
            continue
        origin = Path(module.__file__).resolve()
        if (line := _string_import(origin)) is not None:
            raise UnshippableImport(f"{function_dir.name}: {name} line {line} imports by a string, which the asset "
                                    "cannot follow: import the module by name")
        if "." not in name:  # a top-level package (or module): where it really lives, not where REPO_ROOT has one
            packages[name] = origin.parent if origin.name == "__init__.py" else origin
    # A bad "package.name" that starts with a found package is `from package import name` of a
    # name that is not a module: an attribute, not a missing file.
    provided = set(packages) | LAMBDA_RUNTIME_PACKAGES | _runtime_standard_library()
    missing = sorted((name, sorted(importers)) for name, importers in finder.badmodules.items()
                     if name.split(".")[0] not in provided)
    if missing:
        name, importers = missing[0]
        raise UnshippableImport(
            f"{function_dir.name}: {importers[0]} imports {name!r}, which neither this repository, the Lambda "
            f"runtime's standard library nor its SDK ({', '.join(sorted(LAMBDA_RUNTIME_PACKAGES))}) provides: "
            "vendor it into the asset or drop the import")
    packages.pop(function_dir.name, None)
    return dict(sorted(packages.items()))


def stage_function(function_dir: Path, entry_modules: list[str], into: Path) -> Path:
    """``into/<function>``: a folder holding ``function_dir`` as a package and the repository
    packages it needs, every file readable by the runtime's user. Staged under the cloud assembly
    (not a temporary folder) so that a synth with asset staging disabled, which points the
    template at this folder itself, still finds it afterwards; its content, not its path, decides
    the asset hash, so a change to any of the packages redeploys the function."""
    out = into / function_dir.name
    shutil.rmtree(out, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(function_dir, out / function_dir.name, ignore=ignore)
    for name, source in first_party_packages(function_dir, entry_modules).items():
        if source.is_dir():
            shutil.copytree(source, out / name, ignore=ignore)
        else:
            shutil.copy2(source, out / source.name)
    # Lambda runs the code as another user than the one who checked it out; a 0600 file from a
    # `umask 077` clone would fail at import there and nowhere here.
    for path in out.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return out


# --- The watcher function ---------------------------------------------------------------------

FUNCTION_DIR = REPO_ROOT / "infra" / "lambdas" / "image_watcher"
WATCH_HANDLER = "image_watcher.watcher.watch"
"""The function the runtime calls; the asset carries every repository package its module imports."""


def stage_asset(into: Path) -> Path:
    """The watcher's asset folder under ``into``: ``image_watcher/`` and the repository packages it imports."""
    return stage_function(FUNCTION_DIR, [WATCH_HANDLER.rpartition(".")[0]], into)


# A watch makes at most 7 registry requests one after another (resolve_digest: HEAD, token, HEAD,
# GET; platform_problem: GET, token, GET), each bounded by REQUEST_TIMEOUT_S, then a few AWS calls:
# a slow registry must end in the watcher's own RegistryError, not in Lambda's "Task timed out".
WATCH_TIMEOUT_S = int(7 * REQUEST_TIMEOUT_S) + 60


class WatcherFunctions(Construct):
    """Exposes :attr:`watcher` (scheduled)."""

    def __init__(self, scope: Construct, construct_id: str, *, image_repository: str, image_tag: str,
                 parameter: ssm.StringParameter, table: dynamodb.Table, pipeline_arn: str,
                 pipeline_name: str, max_attempts: int, maintenance_window: str) -> None:
        super().__init__(scope, construct_id)
        code = lambda_.Code.from_asset(str(stage_asset(Path(Stage.of(self).outdir) / ".lambda-assets")))
        environment = {
            "IMAGE_REPOSITORY": image_repository, "IMAGE_TAG": image_tag,
            "PROMOTED_DIGEST_PARAMETER": parameter.parameter_name, "HISTORY_TABLE": table.table_name,
            "PIPELINE_NAME": pipeline_name, "MAX_ATTEMPTS": str(max_attempts),
            "MAINTENANCE_WINDOW": maintenance_window,
        }
        self.watcher = self._function("ImageWatcher", WATCH_HANDLER, code, environment,
                                      "Resolve the image tag; start the pipeline for a new digest", [
            iam.PolicyStatement(sid="ReadPromotedDigest", actions=["ssm:GetParameter"],
                                resources=[parameter.parameter_arn]),
            iam.PolicyStatement(sid="ReadHistory", actions=["dynamodb:Query"], resources=[table.table_arn]),
            # triggered / rejected / ended items, in the image's partition only (never the promoted digest's)
            iam.PolicyStatement(sid="RecordHistory", actions=["dynamodb:PutItem"], resources=[table.table_arn],
                                conditions={"ForAllValues:StringEquals": {
                                    "dynamodb:LeadingKeys": [f"{image_repository}:{image_tag}"]}}),
            # GetPipelineExecution: whether a digest's last run ended before Smoke (a retry)
            iam.PolicyStatement(sid="StartPipeline", actions=["codepipeline:StartPipelineExecution",
                                                              "codepipeline:GetPipelineExecution"],
                                resources=[pipeline_arn]),
        ])

    def _function(self, construct_id: str, handler: str, code: lambda_.Code, environment: dict,
                  description: str, statements: list[iam.PolicyStatement]) -> lambda_.Function:
        log_group = logs.LogGroup(self, f"{construct_id}Logs", retention=logs.RetentionDays.THREE_MONTHS,
                                  removal_policy=RemovalPolicy.DESTROY)
        # Our own role instead of AWSLambdaBasicExecutionRole: logs to this one group only.
        role = iam.Role(self, f"{construct_id}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                        description=description)
        role.add_to_policy(iam.PolicyStatement(
            sid="WriteOwnLogs", actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[log_group.log_group_arn]))
        for statement in statements:
            role.add_to_policy(statement)
        return lambda_.Function(
            self, construct_id, runtime=RUNTIME, handler=handler, code=code, role=role,
            environment=environment, description=description, log_group=log_group,
            # A retried or overlapping watch cannot start a digest twice: the start call carries
            # the digest as its idempotency token (watcher.py).
            architecture=lambda_.Architecture.ARM_64, memory_size=256, timeout=Duration.seconds(WATCH_TIMEOUT_S))
