"""Storage stack: the retained, encrypted, TLS-only, private, versioned, logged checkpoint bucket."""
from __future__ import annotations

import json

from aws_cdk.assertions import Match


def _checkpoint_bucket(synth) -> tuple[str, dict]:
    buckets = synth.resources("storage", "AWS::S3::Bucket")
    [(logical_id, bucket)] = [(k, v) for k, v in buckets.items()
                              if v["Properties"].get("BucketName") == synth.env.bucket_name]
    return logical_id, bucket


def test_bucket_named_from_the_spec(variant):
    _, bucket = _checkpoint_bucket(variant)
    assert bucket["Properties"]["BucketName"] == variant.env.bucket_name


def test_every_bucket_is_retained(default):
    buckets = default.resources("storage", "AWS::S3::Bucket")
    assert len(buckets) == 2  # checkpoints + their access logs
    for bucket in buckets.values():
        assert bucket["DeletionPolicy"] == "Retain" and bucket["UpdateReplacePolicy"] == "Retain"


def test_checkpoint_bucket_logical_id_never_changes(default):
    # A changed logical id would make CloudFormation create a NEW bucket (the old one retained,
    # orphaned, its checkpoints no longer where the runs look).
    logical_id, _ = _checkpoint_bucket(default)
    assert logical_id == "CheckpointsBucket6BA0C50D"


def test_encrypted_private_versioned(default):
    _, bucket = _checkpoint_bucket(default)
    props = bucket["Properties"]
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0][
        "ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True,
        "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["OwnershipControls"]["Rules"] == [{"ObjectOwnership": "BucketOwnerEnforced"}]


def test_lifecycle_aborts_multipart_and_expires_noncurrent_after_spec_days(variant):
    _, bucket = _checkpoint_bucket(variant)
    rules = {r["Id"]: r for r in bucket["Properties"]["LifecycleConfiguration"]["Rules"]}
    assert rules["abort-incomplete-multipart-uploads"]["AbortIncompleteMultipartUpload"] == {
        "DaysAfterInitiation": 1}
    assert rules["expire-noncurrent-versions"]["NoncurrentVersionExpiration"] == {
        "NoncurrentDays": variant.env.storage.noncurrent_version_days}
    assert all(r["Status"] == "Enabled" for r in rules.values())


def test_server_access_logs_go_to_the_log_bucket(default):
    logical_id, bucket = _checkpoint_bucket(default)
    logging = bucket["Properties"]["LoggingConfiguration"]
    log_bucket_id = logging["DestinationBucketName"]["Ref"]
    assert log_bucket_id != logical_id
    assert logging["LogFilePrefix"] == "checkpoint-bucket/"


def test_tls_only_bucket_policy(default):
    logical_id, _ = _checkpoint_bucket(default)
    default.template("storage").has_resource_properties("AWS::S3::BucketPolicy", {
        "Bucket": {"Ref": logical_id},
        "PolicyDocument": {"Statement": Match.array_with([Match.object_like({
            "Effect": "Deny", "Action": "s3:*",
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            "Principal": {"AWS": "*"},
        })])},
    })


def test_outputs_bucket_name(default):
    outputs = default.json("storage")["Outputs"]
    logical_id, _ = _checkpoint_bucket(default)
    assert outputs["BucketName"]["Value"] == {"Ref": logical_id}
    assert outputs["StorageUri"]["Value"] == default.env.storage_uri


def test_code_and_inputs_are_write_once(default):
    """The synthesized bucket policy, evaluated with IAM's rules (tests/iam_policy.py): a put on
    ``code/`` or the inputs without ``If-None-Match: *`` (condition key ``s3:if-none-match``,
    Amazon S3 User Guide "Enforce conditional writes on Amazon S3 buckets") is an explicit Deny,
    whoever asks, so nobody replaces a content-addressed archive that later runs execute. A run's
    own prefix is untouched (checkpoints overwrite their files)."""
    from iam_policy import Request, decide, resolve

    logical_id, _ = _checkpoint_bucket(default)
    [policy] = [r["Properties"]["PolicyDocument"] for r in default.resources("storage", "AWS::S3::BucketPolicy").values()
                if r["Properties"]["Bucket"] == {"Ref": logical_id}]
    bucket, prefix = default.env.bucket_name, default.env.storage.prefix
    # the bucket's own ARN, as CloudFormation resolves GetAtt Arn of an S3 bucket
    arn_of = json.dumps({"Fn::GetAtt": [logical_id, "Arn"]})
    policy = resolve(json.loads(json.dumps(policy).replace(arn_of, json.dumps(f"arn:aws:s3:::{bucket}"))))
    for key in ("code/0123abcd.zip", f"{prefix}/_inputs/0123abcd/data.jsonl"):
        arn = f"arn:aws:s3:::{bucket}/{key}"
        # PutObject and CompleteMultipartUpload create the object (s3:ObjectCreationOperation true)
        creates = {"aws:SecureTransport": "true", "s3:ObjectCreationOperation": "true"}
        assert decide([policy], Request(action="s3:PutObject", resource=arn, context=creates)) == "Deny", key
        assert decide([policy], Request(action="s3:PutObject", resource=arn,
                                        context={**creates, "s3:if-none-match": "*"})) != "Deny", key
        # CreateMultipartUpload and UploadPart are s3:PutObject too and take no condition header:
        # a file over 5 GB goes up in parts, completed with If-None-Match (put_once)
        part = {"aws:SecureTransport": "true", "s3:ObjectCreationOperation": "false"}
        assert decide([policy], Request(action="s3:PutObject", resource=arn, context=part)) != "Deny", key
    # a run's records, and its inputs record that each resume rewrites, stay writable
    for key in (f"{prefix}/run-a/run.json", f"{prefix}/_inputs/run-a.json"):
        run = Request(action="s3:PutObject", resource=f"arn:aws:s3:::{bucket}/{key}",
                      context={"aws:SecureTransport": "true", "s3:ObjectCreationOperation": "true"})
        assert decide([policy], run) != "Deny", key
