"""Which data files under a plain folder are its ``train`` split: ``datasets``' own rule.

A folder of ``.parquet``/``.arrow`` files without ``state.json`` is read the way
``datasets.load_dataset("parquet"/"arrow", data_dir=...)`` assigns its files to splits
(huggingface/datasets 5.0.0 src/datasets/data_files.py: ``SPLIT_KEYWORDS`` l. 43-47,
the filename/folder patterns l. 48-97, ``_get_data_files_patterns`` l. 257-297, hidden and
``__`` folders skipped l. 190-225), so a Hub layout (``data/train-00000-of-00001.parquet`` beside
``data/test-...``) or a ``load_dataset`` cache folder (``json-train.arrow`` beside
``json-test.arrow``) trains on its train rows only. Where that rule cannot tell the train rows
(no train split; ``cache-*.arrow`` files, a ``.map``/``.filter`` result written beside the table
it came from; a saved dataset nested below), the folder is refused in one line.
"""
from __future__ import annotations

import re
from pathlib import PurePosixPath

from training.data.records import DataError
from training.data.remote import RemoteFile

TRAIN = "train"
SPLIT_KEYWORDS = {"train": ("train", "training"), "validation": ("validation", "valid", "dev", "val"),
                  "test": ("test", "testing", "eval", "evaluation")}
"""``datasets.data_files.SPLIT_KEYWORDS``, in ``DEFAULT_SPLITS`` order."""
SEP = "[-._ 0-9]"
"""``datasets.data_files.NON_WORDS_CHARS`` as a character class."""
SHARDED = re.compile(r"data/(?P<split>\w+(?:\.\w+)*)-[0-9]{5}-of-[0-9]{5}[^/]*\.[^/]*")
"""``SPLIT_PATTERN_SHARDED``: ``data/{split}-00000-of-00001*.*``, ``{split}`` as ``naming._split_re``."""
CACHE_FILE = re.compile(r"cache-[^/]*\.arrow")
"""What ``Dataset.map``/``filter`` write into a cache folder (arrow_dataset.py ``_get_cache_file_path``)."""
SAVED = ("state.json", "dataset_dict.json")
"""The files that make a folder a ``save_to_disk`` dataset (``datasets.config``)."""


def _in_dir(keyword: str) -> re.Pattern:
    # **/{kw}/**, **/{kw}[sep]*/**, **/*[sep]{kw}/**, **/*[sep]{kw}[sep]*/** (fsspec >= 2023.12)
    return re.compile(rf"(?:[^/]*{SEP})?{re.escape(keyword)}(?:{SEP}[^/]*)?")


def _in_name(keyword: str) -> re.Pattern:
    # **/{kw}[sep]*, **/*[sep]{kw}[sep]*
    return re.compile(rf"(?:[^/]*{SEP})?{re.escape(keyword)}{SEP}[^/]*")


def _splits(rel: dict[str, RemoteFile]) -> dict[str, list[str]] | None:
    """split -> relative paths, as ``_get_data_files_patterns`` decides; None: no split names (all train)."""
    sharded: dict[str, list[str]] = {}
    for path in rel:
        if m := SHARDED.fullmatch(path):
            sharded.setdefault(m["split"], []).append(path)
    if sharded:
        return sharded
    for where in ("dir", "name"):
        found: dict[str, list[str]] = {}
        for split, keywords in SPLIT_KEYWORDS.items():
            patterns = [(_in_dir if where == "dir" else _in_name)(k) for k in keywords]
            for path in rel:
                parts = PurePosixPath(path).parts
                names = parts[:-1] if where == "dir" else parts[-1:]
                if any(p.fullmatch(n) for p in patterns for n in names):
                    found.setdefault(split, []).append(path)
        if found:
            return found
    return None


def _listed(paths: list[str], n: int = 4) -> str:
    return ", ".join(paths[:n]) + (f" and {len(paths) - n} more" if len(paths) > n else "")


def train_files(root: str, found: list[RemoteFile], suffixes: tuple[str, ...]) -> list[RemoteFile]:
    """The files of ``found`` (every file below the folder ``root``) that are its train split,
    in ``found``'s order; DataError where ``datasets``' rule cannot tell the train rows."""
    rel = {f.uri[len(root) + 1:]: f for f in found}
    # hidden files/folders and `__`-prefixed folders are not data (data_files.py l. 166-225)
    rel = {p: f for p, f in rel.items() if not any(part.startswith(".") for part in PurePosixPath(p).parts)
           and not any(part.startswith("__") for part in PurePosixPath(p).parts[:-1])}
    saved = {str(PurePosixPath(p).parent) for p in rel if PurePosixPath(p).name in SAVED}
    nested = sorted(n for n in saved if not any(n.startswith(f"{m}/") for m in saved))  # the outermost ones
    if nested:
        raise DataError(f"{root}: holds a saved dataset in {_listed([n + '/' for n in nested])} (save_to_disk's "
                        f"{' / '.join(SAVED)}); point data.path at that folder, not at a folder above it")
    data = {p: f for p, f in rel.items() if p.endswith(suffixes)}
    if not data:
        raise FileNotFoundError(f"{root}: no files ending in {'/'.join(suffixes)} and no {SAVED[0]}")
    splits = _splits(data)
    if splits is not None and TRAIN not in splits:
        found_splits = "; ".join(f"{s}: {_listed(ps, 2)}" for s, ps in splits.items())
        raise DataError(f"{root}: its files are split ({found_splits}) and none is a train split "
                        f"(file or folder names with {', '.join(SPLIT_KEYWORDS[TRAIN])}); point data.path at the "
                        "files to train on")
    chosen = list(data) if splits is None else splits[TRAIN]
    cache = [p for p in chosen if CACHE_FILE.fullmatch(PurePosixPath(p).name)]
    if cache and len(chosen) > 1:
        raise DataError(f"{root}: {_listed(cache)} are datasets cache files (cache-*.arrow, a .map/.filter result "
                        f"written beside its source), read with {_listed([p for p in chosen if p not in cache], 2) or 'each other'}"
                        " they would repeat rows; point data.path at one file, or save_to_disk the dataset to train on")
    keep = set(chosen)
    return [f for p, f in data.items() if p in keep]
