"""The update oracle's table (tests/update_oracle.py): for each common edit of environment.toml,
what a later ``cdk deploy`` replaces, rolls or resets, and what ``cdk destroy`` keeps or strips.

Run: ``.venv/bin/python bench/bench_update_oracle.py`` (one in-process synth per edit, about a
minute). Prints the table, then ONE JSON object on its last line (per edit: the changes that
touch running nodes or strip a protection)."""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import copy  # noqa: E402

from infra_variants import capacity_raw, default_raw  # noqa: E402
from update_oracle import CACHE_EDIT, destroy, edit_over, edit_results, table, templates  # noqa: E402


def main() -> None:
    warnings.simplefilter("ignore")
    raw = default_raw()
    baseline = templates(raw)
    results = edit_results(raw, baseline)  # each edit over the first deploy, after a verify
    with_account = copy.deepcopy(capacity_raw())  # the image cache needs an account
    with_account["image"]["pull_through_cache"] = False
    results[CACHE_EDIT[0]] = edit_over(with_account, CACHE_EDIT[1])
    # destroy: what is kept, and what goes with an effect (the rest is simply deleted)
    gone = destroy(baseline)
    results["cdk destroy --all"] = [c for c in gone if c.action == "retain" or c.effect]
    print(table(results))
    print(f"  (and {sum(c.action == 'delete' and not c.effect for c in gone)} more resources deleted)")
    print(json.dumps({"name": "update_oracle", "effects": {
        edit: [f"{c.logical_id}: {c.effect}" for c in changes if c.effect] for edit, changes in results.items()}}))


if __name__ == "__main__":
    main()
