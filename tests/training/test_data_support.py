"""Shared helpers for the data and tokenizer tests (no tests here; a plain module, not a conftest,
so other test packages' conftests stay untouched).

- :func:`qwen_tokenizer_dir`: the real Qwen2.5 tokenizer, built ONCE per test process (~12 s):
  training/assets/qwen2.5-tokenizer is reused when it is current (``make tokenizer``), otherwise
  it is built into a temporary directory.
- :func:`moto_s3` / :func:`use_moto`: one moto S3 server on 127.0.0.1 per test process; a test
  points its clients at it with fake credentials through monkeypatch (undone after the test).
"""
from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ASSET_DIR = ROOT / "training" / "assets" / "qwen2.5-tokenizer"
DEMO_DIR = ROOT / "training" / "assets" / "demo_corpus"


@functools.lru_cache(maxsize=1)
def qwen_tokenizer_dir() -> Path:
    from devtools.tokenizer_build import build, expected_stamp, is_current, ranks_file

    if is_current(ASSET_DIR, expected_stamp(ranks_file())):
        return ASSET_DIR
    tmp = Path(tempfile.mkdtemp(prefix="qwen-tok-"))
    atexit.register(shutil.rmtree, tmp, True)
    return build(tmp / "qwen2.5-tokenizer")


@functools.lru_cache(maxsize=1)
def qwen_tokenizer():
    from training.data.tokenizer import load_tokenizer

    return load_tokenizer(qwen_tokenizer_dir())


@functools.lru_cache(maxsize=1)
def moto_s3() -> str:
    """Start moto's S3 server on loopback; set the AWS variables; return the endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    atexit.register(server.stop)
    host, port = server.get_host_and_port()
    return f"http://{host}:{port}"


def use_moto(monkeypatch) -> str:
    """Point this test's AWS clients at the moto server (undone after the test)."""
    endpoint = moto_s3()
    for key, value in dict(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                           AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    return endpoint


def s3_put_tree(bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=moto_s3(), region_name="us-east-1")
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    for name, body in files.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}".lstrip("/"), Body=body)


def cfg_for(kind: str, path: str, *, seq_len: int = 256, micro: int = 2, world: int = 2, gb: int = 8, **data):
    """A validated JobConfig for data tests (tiny model config; the data section is what matters)."""
    from training.config import job_config_from_dict

    return job_config_from_dict({
        "name": "data-test", "model": {"config": {"hidden_size": 64}},
        "data": {"kind": kind, "path": path, **data},
        "train": {"seq_len": seq_len, "micro_batch_size": micro, "global_batch_size": gb, "max_steps": 40,
                  "warmup_steps": 2},
        "parallel": {"num_workers": world, "workers_per_node": world},
    }, "test")
