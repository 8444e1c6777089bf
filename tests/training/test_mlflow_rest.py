"""The MLflow REST client's SageMaker side and its refusals, without a server (the real-server
tests: tests/training/test_tracking_real_run.py).

SageMaker's managed MLflow, as its own plugin talks to it (aws/sagemaker-mlflow, commit 046823e):
the endpoint ``https://<region>.experiments.sagemaker.aws`` (``mlflow_sagemaker_helpers.py``:
``get_tracking_server_url``), the ARN in ``x-mlflow-sm-tracking-server-arn``
(``mlflow_sagemaker_request_header_provider.py``), SigV4 for the service ``sagemaker-mlflow`` in
the ARN's region with ``X-Amz-Content-SHA256`` set to the body's hash (``auth.py``: ``AuthBoto``).
"""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

import hashlib
import urllib.request
from types import SimpleNamespace

import pytest

from training import metric_sinks
from training.metric_sinks import mlflow as mlflow_sink
from training.mlflow_rest import SAGEMAKER_ARN_HEADER, Tracking

ARN = "arn:aws:sagemaker:eu-west-1:123456789012:mlflow-tracking-server/team"


def test_a_sagemaker_request_is_signed_as_the_plugin_signs_it(monkeypatch):
    answers = []
    request = _sent_through(monkeypatch, lambda t: answers.append(t.call("experiments/create", {"name": "x"})),
                            session_token=None)
    assert answers == [{"experiment": {"experiment_id": "7"}, "run": {}}]
    assert request.full_url == "https://eu-west-1.experiments.sagemaker.aws/api/2.0/mlflow/experiments/create"
    headers = {k.lower(): v for k, v in request.header_items()}
    assert headers[SAGEMAKER_ARN_HEADER] == ARN
    assert headers["x-amz-content-sha256"] == hashlib.sha256(b'{"name": "x"}').hexdigest()
    assert "/eu-west-1/sagemaker-mlflow/aws4_request" in headers["authorization"]
    assert headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "x-mlflow-sm-tracking-server-arn" in headers["authorization"]  # the ARN header is signed too


def _sent_through(monkeypatch, action, session_token: str | None = "token") -> urllib.request.Request:
    """The one request ``action`` sends, as urllib would put it on the wire (answered with an
    experiment and an empty run), with static credentials (``session_token`` None: none)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    if session_token is None:
        monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    else:
        monkeypatch.setenv("AWS_SESSION_TOKEN", session_token)
    sent: list[urllib.request.Request] = []

    class Answer:  # urlopen's answer as a context manager (the stdlib's HTTPResponse)
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return b'{"experiment": {"experiment_id": "7"}, "run": {}}'

    monkeypatch.setattr(urllib.request, "urlopen", lambda request, timeout: sent.append(request) or Answer())
    action(Tracking(ARN))
    return sent[0]


def aws_signature_of(sent: urllib.request.Request) -> tuple[str, str]:
    """(the signature sent, the signature AWS computes for the request it receives).

    The receiving side, with botocore 1.x ``botocore/auth.py`` ``SigV4Auth`` as the oracle of
    AWS's canonical request: the query is DECODED and re-encoded RFC 3986 style
    (``_canonical_query_string_params``: ``percent_encode``, a space is ``%20``), the path taken
    as received and encoded again (``_normalize_url_path``), the headers the Authorization line
    names, the time of ``X-Amz-Date``."""
    from urllib.parse import parse_qsl, urlsplit

    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    url = urlsplit(sent.full_url)
    headers = {k.lower(): v for k, v in sent.header_items()}
    signed = re.search(r"SignedHeaders=([^,]+)", headers["authorization"]).group(1).split(";")
    received = AWSRequest(method=sent.get_method(), url=f"{url.scheme}://{url.netloc}{url.path}",
                          params=parse_qsl(url.query, keep_blank_values=True), data=sent.data or b"",
                          headers={name: headers[name] for name in signed if name != "host"})
    received.context["timestamp"] = headers["x-amz-date"]
    auth = SigV4Auth(Credentials("AKIDEXAMPLE", "secret", "token"), "sagemaker-mlflow", "eu-west-1")
    expected = auth.signature(auth.string_to_sign(received, auth.canonical_request(received)), received)
    return re.search(r"Signature=(\w+)", headers["authorization"]).group(1), expected


@pytest.mark.parametrize("action", [
    lambda t: t.call("experiments/create", {"name": "x"}),
    lambda t: t.experiment_id("team runs"),  # a GET whose query holds a space (MLFLOW_EXPERIMENT_NAME)
    lambda t: t.experiment_id("a+b/c~d"),
    lambda t: t.get_run("0123abcd"),
], ids=["post", "get-with-space", "get-with-reserved", "get"])
def test_aws_computes_the_signature_the_request_carries(monkeypatch, action):
    """Signed as sent: a query encoded with ``+`` for a space (``urlencode``'s default,
    ``quote_plus``) was signed as ``+`` while AWS canonicalizes it as ``%20``: every call with
    a space in a query (an experiment named ``team runs``) was refused with a signature error.
    SageMaker's own plugin does the same fix (aws/sagemaker-mlflow 046823e ``auth.py``
    ``AuthBoto.__call__``: "Mlflow encodes spaces as +, Auth prefers %20")."""
    carried, computed = aws_signature_of(_sent_through(monkeypatch, action))
    assert carried == computed


def test_the_credentials_are_resolved_once_per_tracking_server(monkeypatch):
    """botocore's ``get_session().get_credentials()`` walks the whole provider chain (on EKS: the
    pod identity agent or STS AssumeRoleWithWebIdentity); what it returns refreshes itself
    (``RefreshableCredentials``), as SageMaker's plugin keeps one for its session
    (aws/sagemaker-mlflow 046823e ``auth.py`` ``AuthBoto.__init__``)."""
    import botocore.session

    made: list[int] = []
    real = botocore.session.get_session
    monkeypatch.setattr(botocore.session, "get_session", lambda *a, **k: made.append(1) or real(*a, **k))
    _sent_through(monkeypatch, lambda t: (t.experiment_id("a"), t.get_run("0123"), t.call("experiments/create", {})))
    assert len(made) == 1


@pytest.mark.parametrize("uri, words", [
    ("mlflow.example.com:5000", "is not http(s)://host[:port] nor a SageMaker MLflow ARN"),
    ("arn:aws:s3:::bucket", "not a SageMaker MLflow tracking server ARN"),
    ("arn:aws-cn:sagemaker:cn-north-1:1:mlflow-tracking-server/t", "partition 'aws-cn' is not supported"),
])
def test_a_bad_tracking_uri_is_one_line_naming_it(uri, words):
    with pytest.raises(ValueError, match="tracking URI") as err:
        Tracking(uri)
    assert words in str(err.value) and uri in str(err.value) and "\n" not in str(err.value)
    # the job config's field refuses it before anything starts, with the same rule
    from training.config import JobConfigError, load_job_config

    with pytest.raises(JobConfigError) as refused:
        load_job_config("jobs/local.toml", [f'tracking.mlflow_uri="{uri}"'])
    line = str(refused.value)
    assert line.startswith(f"jobs/local.toml: tracking.mlflow_uri: {uri!r} ") and words in line and "\n" not in line


def test_without_a_tracking_uri_the_driver_logs_nothing(monkeypatch):
    monkeypatch.setattr(mlflow_sink, "export_run", lambda *a, **k: pytest.fail("no server named: nothing to log"))
    for environ in ({}, {mlflow_sink.ENV_TRACKING_URI: "file:///tmp/mlruns"}):
        mlflow_sink.after_run(SimpleNamespace(name="local"), "/nowhere", {}, environ=environ)


def test_a_tracking_failure_is_a_warning_not_the_run_s_failure(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(mlflow_sink.ENV_TRACKING_URI, "http://127.0.0.1:9")  # discard port: refused
    metric_sinks.after_run(SimpleNamespace(name="local"), str(tmp_path), {"job_config": {"name": "local"}},
                           names=("mlflow",))
    err = capsys.readouterr().err
    assert err.startswith("warning: metric sink mlflow: URLError") and err.count("\n") == 1


def test_the_job_config_flattens_to_mlflow_params():
    assert mlflow_sink.flatten({"name": "local", "train": {"max_steps": 10, "lr": 1e-4},
                                "data": {"paths": ["a", "b"], "mix": None}}) == {
        "name": "local", "train.max_steps": "10", "train.lr": "0.0001", "data.paths": '["a", "b"]', "data.mix": "null"}


# Ported from mlflow 3.17.2 (the tracking venv's pin), mlflow/utils/validation.py:
# validate_param_and_metric_name (:321, non-Windows: ``^[/\w.\- :]*$``), path_not_unique (:342:
# the name must be its own posixpath.normpath, not ".", not "..*", not "/*") and
# MAX_ENTITY_KEY_LENGTH (:78, 250): the server refuses a log-batch holding one key that fails them.
MLFLOW_KEY = re.compile(r"^[/\w.\- :]*$")
MAX_ENTITY_KEY_LENGTH = 250


def mlflow_refuses_key(name: str) -> bool:
    norm = posixpath.normpath(name)
    return (not MLFLOW_KEY.match(name) or norm != name or norm == "." or norm.startswith("..")
            or norm.startswith("/") or len(name) > MAX_ENTITY_KEY_LENGTH)


def test_the_oracle_refuses_what_mlflow_refuses():
    assert mlflow_refuses_key("/loss") and mlflow_refuses_key("a//b") and mlflow_refuses_key("a;b")
    assert not mlflow_refuses_key("train/loss") and not mlflow_refuses_key("train.max_steps")


@pytest.mark.parametrize("job", sorted(Path("jobs").glob("*.toml")), ids=lambda p: p.stem)
def test_every_key_the_driver_logs_is_one_mlflow_accepts(job):
    """Every shipped job's params (the config flattened), the tags, and the metric names of rows
    of every kind, including a row without a kind."""
    from training.config import load_job_config
    from training.metric_sinks.mlflow import PARAM_TAG_PREFIX, flatten, metric_entries, run_tags

    config = load_job_config(job).to_dict()
    record = {"job_config": config, "verdict": {"verdict": "accepted"}, "source": {"git_commit": "ab" * 20}}
    rows = [{"kind": kind, "step": 1, "loss": 1.0, "tokens_per_s": 2.0} for kind in ("train", "eval", "summary")]
    rows.append({"step": 2, "loss": 1.0})
    keys = [*flatten(config), *run_tags(record), *(m["key"] for m in metric_entries(rows)),
            *(PARAM_TAG_PREFIX + key for key in flatten(config))]  # a resumed attempt's changed values
    assert [k for k in keys if mlflow_refuses_key(k)] == []
    assert all(len(v) <= 6000 for v in flatten(config).values())


def test_a_bad_request_timeout_after_the_fact_is_one_line_naming_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(mlflow_sink.ENV_REQUEST_TIMEOUT, "soon")
    with pytest.raises(ValueError, match=r"^MLFLOW_HTTP_REQUEST_TIMEOUT='soon': not a whole number of seconds above 0$"):
        mlflow_sink.export_run("http://127.0.0.1:9", str(tmp_path), record={})
