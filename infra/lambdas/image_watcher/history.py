"""Promotion history: one DynamoDB item per event, listable by an operator.

Table keys: ``image`` (partition, ``repository:tag``) and ``at`` (sort, ISO-8601 UTC time).
Each item has ``event`` (``triggered`` by the watcher, ``promoted`` by the pipeline, or
``rolled-back`` when a run failed and the long-lived cluster was put back on the promoted
digest), ``digest``, ``execution_id`` and, for promotions, ``smoke_record`` (where the smoke run's
record lives, e.g. ``s3://bucket/runs/smoke-.../run.json``); a rollback also has ``reason`` and
``rolled_back_to`` (the promoted digest, or ``none`` before the first promotion). List the newest first with::

    aws dynamodb query --table-name TABLE --no-scan-index-forward \\
      --key-condition-expression "image = :i" \\
      --expression-attribute-values '{":i": {"S": "REPOSITORY:TAG"}}'
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Iterator

TRIGGERED = "triggered"
PROMOTED = "promoted"
ROLLED_BACK = "rolled-back"


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
        self.client.put_item(
            TableName=self.table_name, Item={k: {"S": v} for k, v in item.items()},
            # Never overwrite an earlier event that happened to share the timestamp.
            ConditionExpression="attribute_not_exists(#at)", ExpressionAttributeNames={"#at": "at"})
        return item

    def events(self, *, newest_first: bool = True) -> Iterator[dict[str, str]]:
        kwargs = {"TableName": self.table_name, "KeyConditionExpression": "image = :i",
                  "ExpressionAttributeValues": {":i": {"S": self.image}},
                  "ScanIndexForward": not newest_first}
        while True:
            page = self.client.query(**kwargs)
            for item in page.get("Items", []):
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
