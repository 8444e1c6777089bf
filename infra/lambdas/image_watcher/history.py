"""Promotion history: one DynamoDB item per event, listable by an operator.

Table keys: ``image`` (partition, ``repository:tag``) and ``at`` (sort, ISO-8601 UTC time).
Each item has ``event`` (``triggered`` by the watcher; ``applied`` when the pipeline's Apply
put a manifest on the long-lived cluster, with the ``manifest`` JSON and its ``manifest_hash``;
``promoted``; ``rolled-back`` when a run failed, with ``reason``, ``failure`` (image,
infrastructure or deferred: whether the watcher may retry the digest), ``rolled_back_to`` and
``outcome``: what the long-lived cluster was left on; or ``ended`` for a failed execution that
recorded nothing itself), ``digest``, ``execution_id`` and, for
promotions, ``smoke_record`` (where the smoke run's record lives, e.g.
``s3://bucket/runs/smoke-.../run.json``).

One more item per image, ``image = "<repository:tag>#promoted"``, ``at = "~promoted"`` (its own
partition: only Promote's role may write it; a table written before that holds it in the image's
partition, read while the new one does not exist), holds the promoted digest the pipeline serializes on: :meth:`PromotionHistory.promote` swaps it only if
it still holds the digest the run's Synth saw (or does not exist yet: the first such
promotion), in the same transaction as the ``promoted`` item, so two overlapping executions cannot both promote (the later one is superseded). The
SSM parameter is written after it, for the watcher and for reading; the item wins where they
disagree, and Promote repairs the parameter from it (promote.py ``promoted_digest``). List the newest first with::

    aws dynamodb query --table-name TABLE --no-scan-index-forward \\
      --key-condition-expression "image = :i" \\
      --expression-attribute-values '{":i": {"S": "REPOSITORY:TAG"}}'
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Iterator

TRIGGERED = "triggered"
APPLIED = "applied"
PROMOTED = "promoted"
ROLLED_BACK = "rolled-back"
ENDED = "ended"
"""An execution that ended failed with no failure its steps recorded (a build killed by its
CodeBuild timeout, a refused Synth, a failed Deploy): recorded by the watcher on its next tick."""
FAILURE_IMAGE = "image"
"""The ``failure`` of a ``rolled-back`` item whose image is at fault: the smoke run trained and
failed its gates, or the image never started. The digest is shelved (never retried by the watcher)."""
FAILURE_INFRASTRUCTURE = "infrastructure"
"""Not the image: capacity (busy GPUs until ``preRunningDeadlineSeconds``), kubectl or AWS API
errors, a killed build, another execution's promotion. The watcher retries the digest on a later
tick, up to ``pipeline.max_attempts`` executions."""
FAILURE_DEFERRED = "deferred"
"""Apply left the long-lived cluster alone: a job was still running on it after the bounded wait,
or it was outside ``pipeline.maintenance_window``. Retried like an infrastructure failure (inside
the window when one is declared)."""
FAILURES = (FAILURE_IMAGE, FAILURE_INFRASTRUCTURE, FAILURE_DEFERRED)
POINTER_AT = "~promoted"
"""Sort key of the promoted-digest item (not an event: :meth:`PromotionHistory.events` skips it)."""
POINTER_SUFFIX = "#promoted"
"""The promoted-digest item lives in a partition of its own, ``<repository:tag>#promoted``, so
IAM can give it to Promote alone (``dynamodb:LeadingKeys``) while the other steps record history."""


def pointer_key(image: str) -> str:
    """The partition key of ``image``'s promoted-digest item."""
    return image + POINTER_SUFFIX


class Superseded(RuntimeError):
    """The promoted digest is no longer the one this run's Synth saw; one line. Not the image's
    failure: the watcher may start the digest again."""

    failure = FAILURE_INFRASTRUCTURE


def utc_now() -> str:
    """Sortable UTC time with microseconds, so two events of one second stay two items."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, kw_only=True, slots=True)
class PromotionHistory:
    """The table of one image (``repository:tag``), through a boto3 DynamoDB client."""

    client: Any
    table_name: str
    image: str

    def record(self, *, event: str, digest: str, execution_id: str, at: str = "",
               smoke_record: str = "", **extra: str) -> dict[str, str]:
        item = {"image": self.image, "at": at or utc_now(), "event": event, "digest": digest,
                "execution_id": execution_id}
        if smoke_record:
            item["smoke_record"] = smoke_record
        item.update({k: str(v) for k, v in extra.items()})
        self.client.put_item(**self._put(item))
        return item

    def _put(self, item: dict[str, str]) -> dict[str, Any]:
        return {"TableName": self.table_name, "Item": {k: {"S": v} for k, v in item.items()},
                # Never overwrite an earlier event that happened to share the timestamp.
                "ConditionExpression": "attribute_not_exists(#at)", "ExpressionAttributeNames": {"#at": "at"}}

    def promote(self, *, expected: str, digest: str, execution_id: str, smoke_record: str,
                **extra: str) -> dict[str, str]:
        """Compare-and-swap: make ``digest`` the promoted one if the promoted digest is still
        ``expected`` ("" = nothing promoted yet), and record the ``promoted`` item in the same
        DynamoDB transaction. :class:`Superseded` when another execution promoted meanwhile."""
        item = {"image": self.image, "at": utc_now(), "event": PROMOTED, "digest": digest,
                "execution_id": execution_id, "smoke_record": smoke_record,
                **{k: str(v) for k, v in extra.items()}}
        # No item yet: the first compare-and-swap promotion, whatever SSM held before it (a stack
        # deployed before the item existed); from then on the item decides.
        condition = "attribute_not_exists(#d)" if not expected else "attribute_not_exists(#d) OR #d = :expected"
        values = {":digest": {"S": digest}, ":at": {"S": item["at"]}}
        if expected:
            values[":expected"] = {"S": expected}
        try:
            self.client.transact_write_items(TransactItems=[
                {"Update": {"TableName": self.table_name,
                            "Key": {"image": {"S": pointer_key(self.image)}, "at": {"S": POINTER_AT}},
                            "UpdateExpression": "SET #d = :digest, promoted_at = :at",
                            "ConditionExpression": condition, "ExpressionAttributeNames": {"#d": "digest"},
                            "ExpressionAttributeValues": values}},
                {"Put": self._put(item)}])
        except self.client.exceptions.TransactionCanceledException:
            raise Superseded(f"the promoted digest is no longer {expected or 'none'} (now "
                             f"{self.promoted() or 'none'}): another execution promoted meanwhile; "
                             f"{digest} is not promoted") from None
        return item

    def promoted(self) -> str:
        """The digest of the promoted-digest item ("" before the first CAS promotion); the
        item in the image's partition while its own partition has none (a table from before)."""
        for partition in (pointer_key(self.image), self.image):
            reply = self.client.get_item(TableName=self.table_name, ConsistentRead=True,
                                         Key={"image": {"S": partition}, "at": {"S": POINTER_AT}})
            if digest := reply.get("Item", {}).get("digest", {}).get("S", ""):
                return digest
        return ""

    def events(self, *, newest_first: bool = True) -> Iterator[dict[str, str]]:
        kwargs = {"TableName": self.table_name, "KeyConditionExpression": "image = :i",
                  "ExpressionAttributeValues": {":i": {"S": self.image}},
                  "ScanIndexForward": not newest_first, "ConsistentRead": True}
        while True:
            page = self.client.query(**kwargs)
            for item in page.get("Items", []):
                if item["at"]["S"] != POINTER_AT:
                    yield {k: v["S"] for k, v in item.items()}
            if "LastEvaluatedKey" not in page:
                return
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def knows(self, digest: str) -> bool:
        """Has the pipeline handled ``digest`` before (triggered, promoted or rolled back)?"""
        return any(e["digest"] == digest for e in self.events())

    def promotions(self) -> list[dict[str, str]]:
        """Promotions, newest first: the digests a rollback can return to."""
        return [e for e in self.events() if e["event"] == PROMOTED]

    def applied(self, execution_id: str) -> dict[str, str] | None:
        """The ``applied`` item of one execution (the manifest its Apply put on the cluster)."""
        return next((e for e in self.events() if e["event"] == APPLIED and e["execution_id"] == execution_id), None)
