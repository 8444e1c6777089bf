"""``hf``: Hugging Face datasets as files: a ``Dataset.save_to_disk`` folder, a
``DatasetDict.save_to_disk`` folder (its ``train`` split), or ``.parquet`` / ``.arrow`` files
(of a folder, its train split's files: :func:`train_files`); local or ``s3://``.

Read with pyarrow (Ray ships it, so the DLC has it; S3 as everywhere in the job:
training/storage/files.py), the way ``datasets`` 5.0.0 itself loads a saved dataset:
``state.json``'s ``_data_files`` in order, each an Arrow IPC *stream*; ``dataset_dict.json``
names the splits, one folder each. A plain ``.arrow`` file may also be the IPC *file* format
(``pyarrow.feather``), recognised by its ``ARROW1`` magic.

Each row is one record of a record format, chosen once per file from its columns
(:func:`~training.data.formats.record_formats`: ``messages`` -> chat, ``conversations`` ->
sharegpt, ``instruction`` + ``output`` -> alpaca, ``text`` -> jsonl's text; columns of two
conversation formats are refused). Errors name the file and the row (1-based within the file).

Which data files under a plain folder are its ``train`` split: ``datasets``' own rule.

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

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from training.data.records import DataError, DataFormat, Reader, add_record, read_head
from training.storage.files import RemoteFile, filesystem_for, is_s3, list_files

SUFFIXES = (".parquet", ".arrow")
STATE = "state.json"
"""``datasets.config.DATASET_STATE_JSON_FILENAME``."""
DATASET_DICT = "dataset_dict.json"
"""``datasets.config.DATASETDICT_JSON_FILENAME``."""
SPLIT = "train"
BATCH_ROWS = 1024
IPC_FILE_MAGIC = b"ARROW1"

SPLIT_KEYWORDS = {"train": ("train", "training"), "validation": ("validation", "valid", "dev", "val"),
                  "test": ("test", "testing", "eval", "evaluation")}
"""``datasets.data_files.SPLIT_KEYWORDS``, in ``DEFAULT_SPLITS`` order."""
SEP = "[-._ 0-9]"
"""``datasets.data_files.NON_WORDS_CHARS`` as a character class."""
SHARDED = re.compile(r"data/(?P<split>\w+(?:\.\w+)*)-[0-9]{5}-of-[0-9]{5}[^/]*\.[^/]*")
"""``SPLIT_PATTERN_SHARDED``: ``data/{split}-00000-of-00001*.*``, ``{split}`` as ``naming._split_re``."""
CACHE_FILE = re.compile(r"cache-[^/]*\.arrow")
"""What ``Dataset.map``/``filter`` write into a cache folder (arrow_dataset.py ``_get_cache_file_path``)."""
SAVED = (STATE, DATASET_DICT)
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
    if splits is not None and SPLIT not in splits:
        found_splits = "; ".join(f"{s}: {_listed(ps, 2)}" for s, ps in splits.items())
        raise DataError(f"{root}: its files are split ({found_splits}) and none is a train split "
                        f"(file or folder names with {', '.join(SPLIT_KEYWORDS[SPLIT])}); point data.path at the "
                        "files to train on")
    chosen = list(data) if splits is None else splits[SPLIT]
    cache = [p for p in chosen if CACHE_FILE.fullmatch(PurePosixPath(p).name)]
    if cache and len(chosen) > 1:
        raise DataError(f"{root}: {_listed(cache)} are datasets cache files (cache-*.arrow, a .map/.filter result "
                        f"written beside its source), read with {_listed([p for p in chosen if p not in cache], 2) or 'each other'}"
                        " they would repeat rows; point data.path at one file, or save_to_disk the dataset to train on")
    keep = set(chosen)
    return [f for p, f in data.items() if p in keep]


def _json(f: RemoteFile) -> Any:
    try:
        return json.loads(read_head(f, None)[0].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{f.uri}: not valid JSON ({err})") from None


def dataset_files(path: str) -> list[RemoteFile]:
    """The data files of ``path`` in the order ``datasets.load_from_disk`` reads them."""
    found = list_files(path)
    root = path.rstrip("/") if is_s3(path) else str(Path(path))  # as list_files names local files
    by_uri = {f.uri: f for f in found}
    if f"{root}/{DATASET_DICT}" in by_uri:
        splits = _json(by_uri[f"{root}/{DATASET_DICT}"]).get("splits", [])
        if SPLIT not in splits:
            raise DataError(f"{root}/{DATASET_DICT}: a DatasetDict without a {SPLIT!r} split (splits: "
                            f"{', '.join(map(str, splits)) or 'none'}); point data.path at the split's folder")
        return dataset_files(f"{root}/{SPLIT}")
    if f"{root}/{STATE}" in by_uri:
        names = [entry["filename"] for entry in _json(by_uri[f"{root}/{STATE}"]).get("_data_files", [])]
        missing = [n for n in names if f"{root}/{n}" not in by_uri]
        if missing or not names:
            raise DataError(f"{root}/{STATE}: _data_files names {', '.join(missing) or 'no file'}, not in the folder "
                            "(an incomplete save_to_disk copy?)")
        return [by_uri[f"{root}/{n}"] for n in names]
    if [f.uri for f in found] == [root]:  # data.path names one file
        return found
    return train_files(root, found, SUFFIXES)


def _open(f: RemoteFile):
    import pyarrow as pa

    if is_s3(f.uri):
        s3, path = filesystem_for(f.uri)
        return s3.open_input_file(path)
    return pa.memory_map(f.uri)


def _batches(f: RemoteFile) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = _open(f)
    try:
        if f.uri.endswith(".parquet"):
            yield from pq.ParquetFile(source).iter_batches(batch_size=BATCH_ROWS)
            return
        magic = source.read(len(IPC_FILE_MAGIC))
        source.seek(0)
        if magic == IPC_FILE_MAGIC:
            ipc = pa.ipc.open_file(source)
            yield from (ipc.get_batch(i) for i in range(ipc.num_record_batches))
        else:
            yield from pa.ipc.open_stream(source)
    except (pa.ArrowInvalid, OSError) as err:
        raise DataError(f"{f.uri}: not a readable {f.uri.rsplit('.', 1)[-1]} file ({str(err).splitlines()[0]})") from None
    finally:
        source.close()


def _converter(f: RemoteFile, columns: list[str]):
    from training.data.formats import record_formats  # the registry this container reads through

    choices = record_formats()
    matches = [(kind, fmt) for kind, fmt in choices if set(fmt.columns) <= set(columns)]
    # two conversation formats (alpaca's instruction/output beside sharegpt's conversations) would
    # be two different readings of one row; a text column beside a conversation is its rendering
    if len([fmt for _, fmt in matches if fmt.conversations]) > 1:
        both = "; ".join(f"{kind} ({', '.join(fmt.columns)})" for kind, fmt in matches if fmt.conversations)
        raise DataError(f"{f.uri}: columns {', '.join(columns)} match more than one record format ({both}); "
                        "keep the columns of one (e.g. Dataset.remove_columns) and save again")
    if matches:
        return matches[0][1].record
    wanted = "; ".join(f"{kind} ({', '.join(fmt.columns)})" for kind, fmt in choices)
    raise DataError(f"{f.uri}: columns {', '.join(columns) or 'none'} match no record format (rows need: {wanted})")


def read(reader: Reader, f: RemoteFile, limit: int | None) -> bool:
    """The rows of one file as documents; at most about ``limit`` bytes of Arrow data."""
    record, row, seen = None, 0, 0
    for batch in _batches(f):
        if limit is not None and seen >= limit:
            return False
        record = record or _converter(f, batch.schema.names)
        for value in batch.to_pylist():
            row += 1
            add_record(reader, f.uri, row, value, record, unit="row")
        seen += batch.nbytes
    return True


FORMAT = DataFormat(summary="a Hugging Face dataset (save_to_disk folder, .parquet or .arrow files)",
                    suffixes=SUFFIXES, read=read, files=dataset_files)
