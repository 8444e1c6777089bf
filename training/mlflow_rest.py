"""MLflow's REST API with the standard library only (the DLC ships no MLflow client): a tracking
server at ``http(s)://host[:port]``, or SageMaker's managed MLflow named by its ARN, with every
request SigV4-signed (botocore, in the DLC via boto3).

The calls (MLflow REST API 2.0, as served by mlflow 3.17.2 ``mlflow/server/handlers.py``):
``experiments/get-by-name``, ``experiments/create``, ``runs/create``, ``runs/search``, ``runs/get``,
``runs/log-batch``, ``runs/update``, and the artifact proxy ``PUT /api/2.0/mlflow-artifacts/artifacts/<path>`` for a
run whose ``artifact_uri`` is ``mlflow-artifacts:/<path>`` (what ``mlflow server`` gives runs by
default; another store, as SageMaker's S3 one, is written with pyarrow, as the run's storage is). ``log-batch`` takes at most :data:`MAX_METRICS_PER_BATCH` metrics,
:data:`MAX_PARAMS_TAGS_PER_BATCH` params and as many tags, :data:`MAX_ENTITIES_PER_BATCH` in all.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterable, Iterator

from training.config_checks import tracking_uri_problem

API = "/api/2.0/mlflow"
ARTIFACTS_API = "/api/2.0/mlflow-artifacts/artifacts"
ARTIFACT_SCHEME = "mlflow-artifacts:"
# mlflow 3.17.2 mlflow/utils/validation.py: MAX_PARAMS_TAGS_PER_BATCH, MAX_METRICS_PER_BATCH,
# MAX_ENTITIES_PER_BATCH, MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH.
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_ENTITIES_PER_BATCH = 1000
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
# aws/sagemaker-mlflow (commit 046823e) sagemaker_mlflow/auth.py: SERVICE_NAME;
# mlflow_sagemaker_helpers.py: get_tracking_server_url; mlflow_sagemaker_request_header_provider.py.
SAGEMAKER_SERVICE = "sagemaker-mlflow"
SAGEMAKER_ARN_HEADER = "x-mlflow-sm-tracking-server-arn"


def wire_number(value: float) -> float | str:
    """A metric value as MLflow's REST API takes it: proto3's JSON mapping writes a non-finite
    double as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (what MLflow's own client
    sends, ``message_to_json``). A bare ``NaN`` (``json.dumps``' default) is refused by protobuf
    7.36.2 ``json_format._ConvertFloat``, and mlflow 3.17.2 ``server/handlers.py``
    ``_get_request_message`` swallows that error and logs the half-parsed batch: the metrics
    after it and its tags are lost, a 0.0 at step 0 is stored instead."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


class MlflowError(RuntimeError):
    """A request the tracking server refused: the call, the HTTP status and MLflow's error code."""


def sagemaker_endpoint(arn: str) -> tuple[str, str]:
    """``(https://<region>.experiments.sagemaker.aws, region)`` for a SageMaker MLflow tracking
    server ARN (``arn:aws:sagemaker:<region>:<account>:mlflow-tracking-server/<name>``)."""
    problem = tracking_uri_problem(arn) if arn.startswith("arn:") else "is not an ARN"
    if problem:
        raise ValueError(f"tracking URI {arn!r}: {problem}")
    parts = arn.split(":")
    return f"https://{parts[3]}.experiments.sagemaker.aws", parts[3]


class Tracking:
    """One tracking server. ``uri``: ``http(s)://host[:port]`` or a SageMaker tracking server ARN."""

    def __init__(self, uri: str, *, timeout_s: float = 30.0):
        self.uri = uri
        self.timeout_s = timeout_s
        self._credentials: Any = None
        if uri.startswith("arn:"):
            self.base, self.region = sagemaker_endpoint(uri)
        elif not tracking_uri_problem(uri):
            self.base, self.region = uri.rstrip("/"), ""
        else:
            raise ValueError(f"tracking URI {uri!r}: {tracking_uri_problem(uri)}")

    def _headers(self, method: str, url: str, body: bytes, content_type: str) -> dict[str, str]:
        headers = {"Content-Type": content_type}
        if not self.region:
            return headers
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.session import get_session

        headers[SAGEMAKER_ARN_HEADER] = self.uri
        headers["X-Amz-Content-SHA256"] = hashlib.sha256(body).hexdigest()
        request = AWSRequest(method=method, url=url, data=body, headers=headers)
        if self._credentials is None:  # once: they refresh themselves (RefreshableCredentials)
            self._credentials = get_session().get_credentials()
        if self._credentials is None:  # botocore's NoCredentialsError is no OSError: a caller's one line
            raise MlflowError("no AWS credentials to sign the requests to the SageMaker MLflow tracking server with (SigV4)")
        SigV4Auth(self._credentials, SAGEMAKER_SERVICE, self.region).add_auth(request)
        return dict(request.headers.items())

    def request(self, method: str, path: str, body: bytes = b"", *, query: dict[str, str] | None = None,
                content_type: str = "application/json") -> dict[str, Any]:
        """One call; the JSON answer ({} when empty). Raises :class:`MlflowError` on an HTTP error."""
        # A space as %20, not urlencode's default "+": SigV4 signs the query as sent while AWS
        # canonicalizes it RFC 3986 style (botocore auth.py percent_encode), so a "+" never verifies.
        query_text = urllib.parse.urlencode(query, quote_via=urllib.parse.quote) if query else ""
        url = self.base + urllib.parse.quote(path) + (f"?{query_text}" if query_text else "")
        req = urllib.request.Request(url, data=body if method in ("POST", "PUT") else None, method=method,
                                     headers=self._headers(method, url, body, content_type))
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as answer:
                text = answer.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode("utf-8", "replace")
            try:
                code = json.loads(detail).get("error_code", "")
            except ValueError:
                code = ""
            raise MlflowError(f"{method} {path}: HTTP {err.code} {code or detail[:200]}") from None
        return json.loads(text) if text.strip() else {}

    def call(self, endpoint: str, payload: dict[str, Any] | None = None, *, get: dict[str, str] | None = None) -> dict:
        """``POST /api/2.0/mlflow/<endpoint>`` with ``payload``, or a GET with query ``get``."""
        if get is not None:
            return self.request("GET", f"{API}/{endpoint}", query=get)
        # allow_nan=False: a non-finite number not sent through wire_number is an error here, not
        # a batch the server half-logs.
        return self.request("POST", f"{API}/{endpoint}", json.dumps(payload or {}, allow_nan=False).encode("utf-8"))

    def experiment_id(self, name: str) -> str:
        """The experiment's id, created when absent."""
        try:
            return self.call("experiments/get-by-name", get={"experiment_name": name})["experiment"]["experiment_id"]
        except MlflowError as err:
            if "RESOURCE_DOES_NOT_EXIST" not in str(err):
                raise
        return self.call("experiments/create", {"name": name})["experiment_id"]

    def create_run(self, experiment_id: str, run_name: str, tags: dict[str, str], start_ms: int) -> dict[str, Any]:
        """``runs/create``: the run's ``info`` (``run_id``, ``artifact_uri``)."""
        return self.call("runs/create", {"experiment_id": experiment_id, "run_name": run_name, "start_time": start_ms,
                                         "tags": [{"key": k, "value": v} for k, v in tags.items()]})["run"]["info"]

    def log_batch(self, run_id: str, *, metrics: list[dict] = (), params: dict[str, str] | None = None,
                  tags: dict[str, str] | None = None) -> int:
        """Everything in as few ``runs/log-batch`` calls as the limits allow; returns the call count."""
        calls = 0
        for chunk in batches(metrics, [{"key": k, "value": v} for k, v in (params or {}).items()],
                             [{"key": k, "value": v} for k, v in (tags or {}).items()]):
            self.call("runs/log-batch", {"run_id": run_id, **chunk})
            calls += 1
        return calls

    def finish_run(self, run_id: str, status: str, end_ms: int | None = None) -> None:
        """``runs/update``: FINISHED, FAILED or KILLED, and the end time."""
        self.call("runs/update", {"run_id": run_id, "status": status, "end_time": end_ms or int(time.time() * 1000)})

    def reopen_run(self, run_id: str) -> None:
        """``runs/update`` to RUNNING: a run continued by a new driver (mlflow 3.17.2
        ``sqlalchemy_store.update_run_info`` sets any status on an active run)."""
        self.call("runs/update", {"run_id": run_id, "status": "RUNNING"})

    def find_run(self, experiment_id: str, tag: str, value: str) -> dict[str, Any] | None:
        """The active run of the experiment whose tag ``tag`` is ``value`` (the oldest when
        several are), as ``runs/search`` returns it (``info`` and ``data``); None when none is.

        The filter grammar is mlflow 3.17.2 ``mlflow/utils/search_utils.py``: a key in backticks
        (``_trim_backticks``), a value in single or double quotes with no escapes
        (``_strip_quotes`` trims the ends). A value holding both quote characters is searched
        with ``LIKE``, each quote and backslash (an escape in MySQL's LIKE) a one-character
        wildcard, and the runs found are compared with the value here."""
        if "`" in tag:
            return None
        quote = "'" if "'" not in value else '"'
        if quote not in value:
            condition = f"= {quote}{value}{quote}"
        else:
            condition = "LIKE '" + value.replace("\\", "_").replace("'", "_") + "'"
        body = {"experiment_ids": [experiment_id], "max_results": 100, "filter": f"tags.`{tag}` {condition}",
                "order_by": ["attributes.start_time ASC"]}
        for run in self.call("runs/search", body).get("runs") or []:
            if any(t.get("key") == tag and t.get("value") == value for t in (run.get("data") or {}).get("tags") or []):
                return run
        return None

    def get_run(self, run_id: str) -> dict[str, Any]:
        """``runs/get``: the run's ``info`` and ``data`` (params, tags, latest metrics)."""
        return self.call("runs/get", get={"run_id": run_id})["run"]

    def put_artifact(self, artifact_uri: str, relative: str, data: bytes) -> None:
        """One file under the run's artifacts: through the server's artifact proxy
        (``mlflow-artifacts:``), else into the store the server names, written as the run's own
        storage is (``s3://``: SageMaker's managed MLflow serves no proxy, its runs' artifacts
        are in its S3 artifact store, which its clients write themselves)."""
        if artifact_uri.startswith(ARTIFACT_SCHEME):
            root = artifact_uri[len(ARTIFACT_SCHEME):].lstrip("/")
            self.request("PUT", f"{ARTIFACTS_API}/{root}/{relative}", data, content_type="application/octet-stream")
            return
        from training.storage.files import filesystem_for  # pyarrow: only for such a store

        filesystem, folder = filesystem_for(artifact_uri)
        path = f"{folder.rstrip('/')}/{relative}"
        filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with filesystem.open_output_stream(path, compression=None) as out:  # as given: an artifact named .gz stays as is
            out.write(data)


def batches(metrics: Iterable[dict], params: list[dict], tags: list[dict]) -> Iterator[dict[str, list]]:
    """``log-batch`` bodies within the limits: params and tags first (100 each), then metrics
    (1000 a call, and never more than 1000 entities in all)."""
    metrics = list(metrics)
    while params or tags or metrics:
        body: dict[str, list] = {"params": params[:MAX_PARAMS_TAGS_PER_BATCH], "tags": tags[:MAX_PARAMS_TAGS_PER_BATCH]}
        params, tags = params[MAX_PARAMS_TAGS_PER_BATCH:], tags[MAX_PARAMS_TAGS_PER_BATCH:]
        room = min(MAX_METRICS_PER_BATCH, MAX_ENTITIES_PER_BATCH - len(body["params"]) - len(body["tags"]))
        body["metrics"], metrics = metrics[:room], metrics[room:]
        yield body
