"""``hf``: Hugging Face datasets as files: a ``Dataset.save_to_disk`` folder, a
``DatasetDict.save_to_disk`` folder (its ``train`` split), or ``.parquet`` / ``.arrow`` files
(of a folder, its train split's files: training/data/splits.py); local or ``s3://``.

Read with pyarrow (Ray ships it, so the DLC has it; S3 as everywhere in the job:
training/data/remote.py), the way ``datasets`` 5.0.0 itself loads a saved dataset:
``state.json``'s ``_data_files`` in order, each an Arrow IPC *stream*; ``dataset_dict.json``
names the splits, one folder each. A plain ``.arrow`` file may also be the IPC *file* format
(``pyarrow.feather``), recognised by its ``ARROW1`` magic.

Each row is one record of a record format, chosen once per file from its columns
(:func:`~training.data.formats.record_formats`: ``messages`` -> chat, ``conversations`` ->
sharegpt, ``instruction`` + ``output`` -> alpaca, ``text`` -> jsonl's text; columns of two
conversation formats are refused). Errors name the file and the row (1-based within the file).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from training.data.records import DataError, DataFormat, Reader, add_record, read_head
from training.data.remote import RemoteFile, is_s3, list_files, s3_filesystem, split_s3
from training.data.splits import train_files

SUFFIXES = (".parquet", ".arrow")
STATE = "state.json"
"""``datasets.config.DATASET_STATE_JSON_FILENAME``."""
DATASET_DICT = "dataset_dict.json"
"""``datasets.config.DATASETDICT_JSON_FILENAME``."""
SPLIT = "train"
BATCH_ROWS = 1024
IPC_FILE_MAGIC = b"ARROW1"


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
        bucket, key = split_s3(f.uri)
        return s3_filesystem().open_input_file(f"{bucket}/{key}")
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
