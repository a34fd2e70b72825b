"""Caption sources: local text/JSON/JSONL/parquet files or a Hugging Face dataset id.

Row i of the captions is the text of target row i; `check_aligned` makes a count
mismatch an error before any training step.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from aleph._io import work_root
from aleph.errors import DataError

FILE_SUFFIXES = (".txt", ".jsonl", ".json", ".parquet")


def load_captions(source: str | os.PathLike, column: str = "caption", split: str = "train",
                  cache_dir: str | os.PathLike | None = None) -> list[str]:
    """All captions of `source`, in row order.

    A path ending in .txt (one caption per line), .jsonl (one object per line),
    .json (a list of objects) or .parquet reads the `column` field; anything else that
    is not an existing path is taken as a Hugging Face dataset id, loaded with `datasets`
    (split `split`, cached under `cache_dir`, default <work root>/cache/hf).
    """
    path = Path(source).expanduser()
    if path.suffix in FILE_SUFFIXES or path.exists():
        if not path.exists():
            raise DataError(f"captions file {path} does not exist")
        if not path.is_file():
            raise DataError(f"captions source {path} is not a file; expected one of {FILE_SUFFIXES}")
        reader = {".txt": _read_text, ".jsonl": _read_jsonl, ".json": _read_json,
                  ".parquet": _read_parquet}.get(path.suffix)
        if reader is None:
            raise DataError(f"captions file {path}: unsupported type; expected {FILE_SUFFIXES}")
        captions = reader(path, column)
    else:
        captions = _read_hub(str(source), column, split, cache_dir)
    if not captions:
        raise DataError(f"captions source {source}: no rows")
    return captions


def _read_text(path: Path, column: str) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e})") from e
    # split on "\n" only: str.splitlines would also split on \x1c, \u2028, ... inside captions
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _field(obj: object, column: str, where: str) -> str:
    if not isinstance(obj, dict) or column not in obj:
        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise DataError(f"{where}: expected an object with a {column!r} field, got {keys}")
    value = obj[column]
    if not isinstance(value, str):
        raise DataError(f"{where}: field {column!r} is {type(value).__name__}, expected a string")
    return value


def _read_jsonl(path: Path, column: str) -> list[str]:
    out = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{n}: not UTF-8 text ({e})") from e
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: invalid JSON ({e})") from e
            out.append(_field(obj, column, f"{path}:{n}"))
    return out


def _read_json(path: Path, column: str) -> list[str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e})") from e
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: invalid JSON ({e})") from e
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of objects with a {column!r} field")
    return [_field(obj, column, f"{path}[{i}]") for i, obj in enumerate(data)]


def _read_parquet(path: Path, column: str) -> list[str]:
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except Exception as e:  # pyarrow raises several types for a non-parquet file
        raise DataError(f"{path}: not a readable parquet file ({e})") from e
    if column not in schema.names:
        raise DataError(f"{path}: no column {column!r}; columns are {schema.names}")
    try:
        values = pq.read_table(path, columns=[column]).column(column).to_pylist()
    except Exception as e:  # a damaged data page after a readable footer
        why = " ".join(str(e).split())
        raise DataError(f"{path}: column {column!r} is not readable ({type(e).__name__}: {why})") from e
    return _check_strings(values, f"{path} column {column!r}")


def _check_strings(values: list, where: str) -> list[str]:
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise DataError(f"{where}: row {i} is {type(v).__name__}, expected a string")
    return values


def _read_hub(name: str, column: str, split: str, cache_dir) -> list[str]:
    import datasets

    cache = Path(cache_dir) if cache_dir is not None else work_root() / "cache" / "hf"
    try:
        ds = datasets.load_dataset(name, split=split, cache_dir=str(cache))
    except Exception as e:  # offline, unknown id, bad split: datasets raises many types
        raise DataError(
            f"cannot load captions dataset {name!r} (split {split!r}; not a local file, so "
            f"taken as a Hugging Face dataset id: needs network access or a copy in {cache}): "
            f"{type(e).__name__}: {e}") from e
    if column not in ds.column_names:
        raise DataError(f"dataset {name!r}: no column {column!r}; columns are {ds.column_names}")
    return _check_strings(ds[column], f"dataset {name!r} column {column!r}")


def check_aligned(token_rows: int, target_rows: int, token_source: str = "token store",
                  target_source: str = "target store") -> None:
    """Captions and targets are aligned by row: their counts must be equal."""
    if token_rows != target_rows:
        raise DataError(
            f"row count mismatch: {token_source} has {token_rows} rows but {target_source} "
            f"has {target_rows}; row i of the captions must be the text of target i")
