"""training/contract.py tree_hash reads each file in chunks (a model folder's weights are many
GB), with the same hash as over the whole bytes."""
from __future__ import annotations

import hashlib
from pathlib import Path

from training import contract


def test_tree_hash_reads_in_chunks_with_the_whole_files_hash(tmp_path, monkeypatch):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(bytes(range(256)) * 20_000)  # 5 MiB: several chunks
    config = tmp_path / "config.json"
    config.write_text("{}")
    files = [("models/m/model.safetensors", weights), ("models/m/config.json", config)]
    expected = hashlib.sha256()
    for name, path in sorted(files):
        expected.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())

    def whole_file(self):
        raise AssertionError(f"{self} read whole")

    monkeypatch.setattr(Path, "read_bytes", whole_file)
    assert contract.tree_hash(files) == expected.hexdigest()[:16]
