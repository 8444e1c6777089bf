"""Which promoted run the regression gate compares against: the newest COMPARABLE promotion of
ANOTHER digest (a re-proof of the promoted digest is not its own bar), skipping promotions
whose record is gone; with none, "not comparable" and why, never a block. A baseline that exists
but cannot be read (403) fails the gate: it is never skipped as if it were gone."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from infra.lambdas.image_watcher.promote import RecordMissing, RecordUnreadable
from raytrain_eks.pipeline.gate import baseline_record, comparable

A, B, C = ("sha256:" + c * 64 for c in "abc")


def record(world=8, instance="g6.12xlarge", job="sha256:j1") -> dict:
    return {"cluster": {"world_size": world, "instance_type": instance}, "job_config_hash": {"ran": job}}


def ctx(promotions: list[dict], records: dict[str, dict]):
    def read_json(uri):
        if uri not in records:
            raise RecordMissing(f"smoke record {uri} does not exist: nothing promoted")
        if records[uri] is None:
            raise RecordUnreadable(f"smoke record {uri} cannot be read (AccessDenied): nothing promoted")
        return records[uri]

    return SimpleNamespace(history=SimpleNamespace(promotions=lambda: promotions), read_json=read_json)


def test_comparable_names_what_differs():
    assert comparable(record(), record()) == ""
    assert comparable(record(world=16), record()) == "world size 16 vs 8"
    assert comparable(record(job="sha256:j2"), record(instance="p5.48xlarge")) == \
        "instance type g6.12xlarge vs p5.48xlarge; job config sha256:j2 vs sha256:j1"


def test_the_baseline_skips_re_proofs_gone_records_and_other_shapes():
    promotions = [{"digest": C, "smoke_record": "s3://b/c"},        # the candidate's own digest
                  {"digest": B, "smoke_record": "s3://b/gone"},     # lifecycle removed it
                  {"digest": B, "smoke_record": "s3://b/b16"},      # another world size
                  {"digest": A, "smoke_record": "s3://b/a"}]
    records = {"s3://b/c": record(), "s3://b/b16": record(world=16), "s3://b/a": record()}
    assert baseline_record(ctx(promotions, records), record(), C) == ("s3://b/a", "")


def test_no_comparable_baseline_says_why():
    uri, why = baseline_record(ctx([{"digest": A, "smoke_record": "s3://b/a"}], {"s3://b/a": record(world=16)}),
                               record(), B)
    assert uri == "" and why == "s3://b/a: not comparable (world size 8 vs 16)"
    assert baseline_record(ctx([], {}), record(), B) == ("", "no promoted run of another digest yet")


def test_an_unreadable_baseline_fails_the_gate_instead_of_being_skipped():
    promotions = [{"digest": B, "smoke_record": "s3://b/denied"}, {"digest": A, "smoke_record": "s3://b/a"}]
    with pytest.raises(RecordUnreadable, match="cannot be read"):
        baseline_record(ctx(promotions, {"s3://b/denied": None, "s3://b/a": record()}), record(), C)
