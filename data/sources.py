"""Streaming readers for the data stage's sources: JSONL/JSON, Parquet, CSV, text folders, ``datasets``.

Every reader yields ``(where, row)`` with ``row`` in one of the shapes of
:mod:`smolforge.data.schemas` (``text``, ``chat``, ``preference``, ``prompt``, ``feedback``), after column mapping, a
public dataset's layout read into smolforge's (``shape:``, by default detected from the row's keys:
:mod:`smolforge.data.shapes`), domain stamping and :func:`smolforge.data.schemas.validate_row`.
``where`` names the file and the row of every problem:
``raw/a.jsonl line 3``, ``raw/a.csv line 5`` (physical line, header included; ``lines 5-7`` for a
record whose quoted fields span lines), ``raw/a.parquet row 17`` and ``dataset imdb[train] row 9``
(rows count from 1), ``corpus/x.txt`` and ``corpus/x.txt paragraph 2``.

Nothing is read whole: JSONL line by line, Parquet a batch at a time, CSV a record at a time,
``datasets`` memory-mapped (``load_from_disk``) or streamed (``load_dataset(..., streaming=True)``).

With ``on_error="skip"`` bad rows are recorded in a :class:`BadRows` and skipped; problems with a
whole file (missing, empty, not Parquet, broken JSON array) still raise :class:`DataError`.

    >>> import pathlib, tempfile
    >>> csv_file = pathlib.Path(tempfile.mkdtemp()) / "web.csv"
    >>> _ = csv_file.write_text("content,id\\nhello world,1\\n,2\\n")
    >>> source = Source(path=str(csv_file), columns={"text": "content"}, domain="web")
    >>> bad = BadRows()
    >>> [row for _, row in iter_rows(source, "text", on_error="skip", bad=bad)]
    [{'text': 'hello world', 'id': '1', 'domain': 'web'}]
    >>> bad.count, bad.items[0]["where"].endswith("web.csv line 3"), bad.items[0]["error"]
    (1, True, "field 'text' must be a non-empty string, found an empty string")
"""
from __future__ import annotations

import csv
import glob
import gzip
import io
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from smolforge.errors import DataError, RecipeError

from . import shapes
from .schemas import SCHEMAS, validate_row

FORMATS = ("auto", "jsonl", "parquet", "csv", "text", "datasets")
TEXT_UNITS = ("file", "paragraph")
ON_ERROR = ("fail", "skip")
BATCH_ROWS = 1024          # rows per Parquet batch (and per read of a JSON array, in KiB)

# File name endings -> format, for format: auto (".gz" is stripped first, Parquet excluded).
_EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet",
               ".pq": "parquet", ".csv": "csv", ".txt": "text", ".text": "text"}
_DESCRIBE = {"jsonl": "JSON Lines or a JSON array of objects", "parquet": "Parquet",
             "csv": "CSV with a header line", "text": "text", "datasets": "a dataset"}
_DATASET_MARKERS = ("dataset_dict.json", "state.json")   # what save_to_disk leaves in its folder


@dataclass
class Source:
    path: str | None = None        # a file, a glob (e.g. raw/*.parquet) or a folder
    dataset: str | None = None     # a `datasets` dataset: a save_to_disk folder, or a name/path for load_dataset
    format: str = "auto"           # auto | jsonl | parquet | csv | text | datasets (auto: from the extension),
                                   # or a shape name (then the file format is auto)
    shape: str = "auto"            # the rows' layout: auto (each row's keys) or a shape (data/shapes.py: gsm8k, hh...)
    columns: dict[str, str] = field(default_factory=dict)  # shape field -> source column, e.g. {"text": "content"}
    split: str = "train"           # split of a `datasets` dataset
    subset: str | None = None      # its configuration (load_dataset's second argument), e.g. "SFT"
    domain: str | None = None      # stamped on text rows as "domain", unless the row has one and this is None
    text_unit: str = "file"        # text files: one document per file, or "paragraph" (blank-line separated)
    limit: int | None = None       # stop after this many valid rows
    name: str | None = None        # label in reports (default: path or dataset)


@dataclass
class BadRows:
    """Rows that failed validation under on_error: skip — counted and listed, never dropped silently."""

    count: int = 0                                       # bad rows seen so far, over every source
    items: list[dict] = field(default_factory=list)     # every bad row: {"where": ..., "error": ...}

    def add(self, where: str, error: Exception | str) -> None:
        message = str(error)
        if message.startswith(f"{where}: "):
            message = message[len(where) + 2:]
        self.count += 1
        self.items.append({"where": where, "error": message})

    def as_dict(self, limit: int = 20) -> dict:
        """A summary for run reports: the count and the first ``limit`` rows."""
        shown = self.items[:limit]
        return {"count": self.count, "items": shown, "more": self.count - len(shown)}


def file_format(source: Source) -> str:
    """The file format a source is read as: ``format:``, or ``auto`` when ``format:`` names a shape."""
    return shapes.AUTO if source.format in shapes.NAMES else source.format


def row_shape(source: Source) -> str:
    """The shape a source's rows are read as: ``shape:``, else a shape named in ``format:``, else ``auto``.

    >>> row_shape(Source(path="uf.jsonl", format="ultrafeedback")), row_shape(Source(path="h.parquet", shape="hh"))
    ('ultrafeedback', 'hh')
    """
    if source.shape != shapes.AUTO:
        return source.shape
    return source.format if source.format in shapes.NAMES else shapes.AUTO


def source_label(source: Source) -> str:
    """The name a report gives the source: ``name``, else the path, else the dataset."""
    return source.name or source.path or source.dataset or "(a source with neither path nor dataset)"


# ---- configuration ------------------------------------------------------------------------------

class _PlanError(Exception):
    """A path problem; ``missing`` tells "nothing there" (DataError when reading) from a misconfiguration."""

    def __init__(self, message: str, missing: bool = False):
        super().__init__(message)
        self.missing = missing


def _check_config(source: Source, where: str) -> None:
    """Field-level checks that touch no file; RecipeError naming ``where`` and the key."""
    if (source.path is None) == (source.dataset is None):
        if source.path is None:
            raise RecipeError(f"{where}: give path: (a file, glob or folder) or dataset: (a datasets name or "
                              f"save_to_disk folder)")
        raise RecipeError(f"{where}: give path: or dataset:, not both")
    for key in ("path", "dataset"):
        value = getattr(source, key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise RecipeError(f"{where}.{key}: must be a non-empty string, got {value!r}")
    if source.format not in FORMATS and source.format not in shapes.NAMES:
        raise RecipeError(f"{where}.format: unknown format {source.format!r} (expected one of {', '.join(FORMATS)}, "
                          f"or a shape such as ultrafeedback, hh, gsm8k)")
    shapes.resolve(source.shape, where=f"{where}.shape")
    if source.format in shapes.NAMES and source.shape != shapes.AUTO and \
            shapes.resolve(source.shape) != shapes.resolve(source.format):
        raise RecipeError(f"{where}: format: {source.format} and shape: {source.shape} name two different shapes")
    if source.dataset is not None and file_format(source) not in ("auto", "datasets"):
        raise RecipeError(f"{where}.format: a dataset: source is read with the datasets library; format: must be "
                          f"auto or datasets, not {source.format!r} (use path: for {source.format} files)")
    if source.text_unit not in TEXT_UNITS:
        raise RecipeError(f"{where}.text_unit: unknown text unit {source.text_unit!r} "
                          f"(expected one of {', '.join(TEXT_UNITS)})")
    if source.limit is not None and (isinstance(source.limit, bool) or not isinstance(source.limit, int)
                                     or source.limit < 0):
        raise RecipeError(f"{where}.limit: must be a whole number >= 0 (or unset), got {source.limit!r}")
    if not isinstance(source.columns, dict):
        raise RecipeError(f"{where}.columns: must be a mapping of shape field -> source column, "
                          f"got {type(source.columns).__name__}")
    for key, value in source.columns.items():
        if not isinstance(key, str) or not key or not isinstance(value, str) or not value:
            raise RecipeError(f"{where}.columns: {key!r}: {value!r} must map a field name to a column name "
                              f"(both non-empty strings)")
    if not isinstance(source.split, str) or not source.split:
        raise RecipeError(f"{where}.split: must be a non-empty string, got {source.split!r}")
    if source.domain is not None and (not isinstance(source.domain, str) or not source.domain.strip()):
        raise RecipeError(f"{where}.domain: must be a non-empty string (or unset), got {source.domain!r}")


def _format_of(name: str) -> str | None:
    lower = name.lower()
    if lower.endswith(".gz"):
        fmt = _EXTENSIONS.get(os.path.splitext(lower[:-3])[1])
        return fmt if fmt in ("jsonl", "csv", "text") else None
    return _EXTENSIONS.get(os.path.splitext(lower)[1])


def _is_saved_dataset(folder: Path) -> bool:
    return any((folder / marker).is_file() for marker in _DATASET_MARKERS)


def _folder_files(folder: Path, fmt: str) -> list[tuple[str, str]]:
    """Data files under ``folder`` (recursive, sorted; names starting with '.' or '_' are skipped)."""
    found = []
    for file in sorted(folder.rglob("*"), key=lambda p: p.relative_to(folder).as_posix()):
        parts = file.relative_to(folder).parts
        if any(part.startswith((".", "_")) for part in parts) or not file.is_file():
            continue
        detected = _format_of(file.name)
        if fmt == "text" or (fmt == "auto" and detected) or (fmt != "auto" and detected == fmt):
            found.append((str(file), fmt if fmt != "auto" else detected))
    if not found:
        wanted = "data files (.jsonl, .json, .parquet, .csv, .txt)" if fmt == "auto" else f"{fmt} files"
        raise _PlanError(f"folder {folder} holds no {wanted}", missing=True)
    kinds = sorted({f for _, f in found})
    if len(kinds) > 1:
        raise _PlanError(f"folder {folder} holds files of several formats ({', '.join(kinds)}); "
                         f"set format: or use a glob such as {folder}/*.parquet")
    return found


def _plan(source: Source) -> list[tuple[str, str]]:
    """The (file, format) pairs to read, in order; ``("<dataset>", "datasets")`` for a dataset."""
    if source.dataset is not None:
        return [(source.dataset, "datasets")]
    path = os.path.expanduser(source.path)
    fmt_asked = file_format(source)
    if fmt_asked == "datasets" or (fmt_asked == "auto" and os.path.isdir(path)
                                       and _is_saved_dataset(Path(path))):
        if not os.path.exists(path):
            raise _PlanError(f"path {source.path!r}: not found (hub datasets go under dataset:)", missing=True)
        return [(path, "datasets")]
    if glob.has_magic(path):
        files = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
        if not files:
            raise _PlanError(f"path {source.path!r} matches no file", missing=True)
    elif os.path.isdir(path):
        return _folder_files(Path(path), fmt_asked)
    elif os.path.isfile(path):
        files = [path]
    else:
        raise _PlanError(f"path {source.path!r}: file not found", missing=True)
    plan = []
    for file in files:
        fmt = fmt_asked if fmt_asked != "auto" else _format_of(file)
        if fmt is None:
            raise _PlanError(f"cannot tell the format of {file!r} from its extension; set format: to one of "
                             f"jsonl, parquet, csv, text")
        plan.append((file, fmt))
    return plan


def source_formats(source: Source) -> list[str]:
    """The formats a source resolves to (``auto`` decided per file), for reports."""
    try:
        return sorted({fmt for _, fmt in _plan(source)})
    except _PlanError:
        return [file_format(source)]


def validate_source(source: Source, where: str, schema: str | None = None) -> None:
    """RecipeError, naming ``where`` (e.g. ``sources.pretrain[0]``), for a source that cannot be read.

    Checks the fields (one of path/dataset, format, shape, text_unit, limit, columns; given the
    ``schema`` its rows go to, that a named shape makes such rows) and that ``path`` matches at least
    one file of a known format. Rows are not read.
    """
    _check_config(source, where)
    if schema is not None:
        shapes.resolve(row_shape(source), schema, f"{where}.{'shape' if source.shape != shapes.AUTO else 'format'}")
    try:
        plan = _plan(source)
    except _PlanError as exc:
        raise RecipeError(f"{where}.path: {exc}") from None
    if source.columns and all(fmt == "text" for _, fmt in plan):
        raise RecipeError(f"{where}.columns: does not apply to text files (each file or paragraph is the 'text')")


# ---- rows ---------------------------------------------------------------------------------------

def _kind(value) -> str:
    """How a wrong value reads in an error: null, the number 5, a list, an empty string..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return "a string" if value.strip() else "an empty string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a value of type {type(value).__name__}"


def _names(columns) -> str:
    names = [str(c) for c in columns]
    if not names:
        return "none"
    shown = ", ".join(names[:20])
    return shown + (f" (+{len(names) - 20} more)" if len(names) > 20 else "")


def _map_columns(row: dict, columns: dict[str, str], where: str) -> dict:
    """Rename source columns to shape fields (mapped ones first); other fields are kept."""
    for target, column in columns.items():
        if column not in row:
            raise DataError(f"{where}: column '{column}' (mapped to '{target}') not found; "
                            f"columns present: {_names(row)}")
    mapped = set(columns.values())
    out = {target: row[column] for target, column in columns.items()}
    out.update((k, v) for k, v in row.items() if k not in mapped and k not in out)
    return out


def _decode_json_cells(row: dict, shape: str, where: str) -> None:
    """CSV cells are strings: decode the JSON message lists a chat/preference/feedback row needs (and a
    feedback row's label, ``true`` or ``false``)."""
    if shape == "chat":
        value = row.get("messages")
        generations = row.get("generations")        # OpenR1-style reasoning rows
        if isinstance(generations, str) and generations.lstrip().startswith("["):
            try:
                row["generations"] = json.loads(generations)
            except json.JSONDecodeError:
                pass                                 # the shape says what it expected
        if isinstance(value, str):
            try:
                row["messages"] = json.loads(value)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: field 'messages' is a string that is not valid JSON ({exc.msg} at "
                                f"column {exc.colno}); a CSV cell holding messages must be a JSON list like "
                                f'[{{"role": "user", "content": "..."}}]') from None
    elif shape in ("preference", "feedback"):
        fields = SCHEMAS["preference"] if shape == "preference" else ("prompt", "completion")
        for name in fields:                     # also an UltraFeedback or implicit row's conversations
            value = row.get(name)
            if isinstance(value, str) and value.lstrip().startswith("["):
                try:
                    decoded = json.loads(value)
                except json.JSONDecodeError:
                    continue                  # plain text that happens to start with '['
                if isinstance(decoded, list):
                    row[name] = decoded
        label = row.get("label")
        if shape == "feedback" and isinstance(label, str) and label.strip().lower() in ("true", "false"):
            row["label"] = label.strip().lower() == "true"       # a CSV cell holds the boolean as text


def _check_fields(row: dict, shape: str, where: str) -> None:
    """What validate_row says without the value found (missing columns, nulls, wrong types)."""
    expected = SCHEMAS[shape]
    for name in expected:
        if name not in row:
            raise DataError(f"{where}: field '{name}' is missing (expected {', '.join(expected)}; "
                            f"the row has {_names(row)})")
        value = row[name]
        if shape == "text":
            if not isinstance(value, str) or not value.strip():
                raise DataError(f"{where}: field '{name}' must be a non-empty string, found {_kind(value)}")
        elif shape == "chat":
            if not isinstance(value, list):
                raise DataError(f"{where}: field '{name}' must be a non-empty list of messages, found {_kind(value)}")
        elif name == "label":
            if not isinstance(value, bool):
                shown = repr(value) if isinstance(value, (str, int, float)) and len(repr(value)) <= 40 else _kind(value)
                raise DataError(f"{where}: field 'label' must be true (a desirable answer) or false, found {shown}")
        elif not isinstance(value, (str, list)):
            raise DataError(f"{where}: field '{name}' must be a non-empty string or a list of messages, "
                            f"found {_kind(value)}")


def _check_columns(label: str, present: list[str], source: Source, shape: str) -> None:
    """For sources with a schema (Parquet, CSV, datasets): missing columns fail the file, not each row."""
    for target, column in source.columns.items():
        if column not in present:
            raise DataError(f"{label}: column '{column}' (mapped to '{target}') not found; "
                            f"columns present: {_names(present)}")
    available = [c for c in present if c not in source.columns.values()] + list(source.columns)
    named = shapes.resolve(row_shape(source), shape)
    if named is None and shapes.fitting(available, shape):
        return                                 # a published shape's columns: each row says which
    expected = named.keys if named is not None else SCHEMAS[shape]
    what = f"a {named.name} row has" if named is not None else "expected"
    others = ", ".join(shapes.published_columns(shape)) if named is None else ""
    for name in expected:
        if name not in available:
            raise DataError(f"{label}: no column '{name}' ({what} {', '.join(expected)}; columns present: "
                            f"{_names(present)}); map one with columns: {{{name}: <column>}}"
                            + (f", or give a published shape's columns ({others})" if others else ""))


def _no_rows(label: str, fmt: str, shape: str) -> DataError:
    return DataError(f"{label}: no rows (expected {_DESCRIBE[fmt]} with {shape} rows: {', '.join(SCHEMAS[shape])})")


# ---- readers: yield (where, raw row) or (where, DataError) for a bad row; raise for a bad file ---

def _open_binary(path: str):
    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found")
    return gzip.open(path, "rb") if path.lower().endswith(".gz") else open(path, "rb")


def _read_json(path: str, shape: str) -> Iterator[tuple[str, dict | DataError]]:
    with _open_binary(path) as handle:
        head = handle.peek(64)[:64] if hasattr(handle, "peek") else b""
        first = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
        if first == b"[":
            yield from _read_json_array(path, handle, shape)
            return
        seen = 0
        for line_no, line in enumerate(handle, start=1):
            if line_no == 1:
                line = line.removeprefix(b"\xef\xbb\xbf")
            if not line.strip():
                continue
            seen += 1
            where = f"{path} line {line_no}"
            try:
                obj = json.loads(line.rstrip(b"\r\n").decode("utf-8"))
            except UnicodeDecodeError as exc:
                yield where, DataError(f"{where}: not valid UTF-8 ({exc.reason} at column {exc.start + 1})")
                continue
            except json.JSONDecodeError as exc:
                hint = " (a .json file must be a JSON array of objects or JSON Lines)" \
                    if line_no == 1 and path.lower().removesuffix(".gz").endswith(".json") else ""
                yield where, DataError(f"{where}: not valid JSON ({exc.msg.removesuffix(' at')} at column "
                                       f"{exc.colno}){hint}")
                continue
            if not isinstance(obj, dict):
                yield where, DataError(f"{where}: expected a JSON object, found {_kind(obj)}")
                continue
            yield where, obj
        if not seen:
            raise _no_rows(path, "jsonl", shape)


def _read_json_array(path: str, binary, shape: str) -> Iterator[tuple[str, dict | DataError]]:
    """Elements of a top-level JSON array, decoded one at a time from a growing buffer."""
    text = io.TextIOWrapper(binary, encoding="utf-8-sig")
    decoder = json.JSONDecoder()
    buf, pos, dropped, eof = "", 0, 0, False

    def more(amount: int) -> None:
        nonlocal buf, pos, dropped, eof
        if pos > 1 << 20:
            buf, dropped, pos = buf[pos:], dropped + pos, 0
        chunk = text.read(max(amount, BATCH_ROWS * 1024))
        eof = not chunk
        buf += chunk

    def skip_space() -> str:
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            if pos < len(buf) or eof:
                return buf[pos] if pos < len(buf) else ""
            more(0)

    def broken(n: int, what: str, at: int | None = None) -> DataError:
        at = pos if at is None else at
        return DataError(f"{path} row {n}: not valid JSON ({what} at character {dropped + at + 1}); "
                         f"the rest of the array cannot be read")

    more(0)
    skip_space()
    pos += 1                                   # the '[' seen by the caller
    n = 0
    while True:
        char = skip_space()
        if char == "]":
            break
        if n:
            if char != ",":
                raise broken(n + 1, "expected ',' or ']' between elements" if char else "the array is not closed")
            pos += 1
            skip_space()
        while True:
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                if eof:
                    raise broken(n + 1, exc.msg.removesuffix(" at"), exc.pos) from None
                more(len(buf) - pos)
                continue
            if end == len(buf) and not eof:    # a number cut by the buffer's end reads as a shorter one
                more(len(buf) - pos)
                continue
            break
        n += 1
        pos = end
        where = f"{path} row {n}"
        yield where, obj if isinstance(obj, dict) else DataError(f"{where}: expected a JSON object, found {_kind(obj)}")
    if not n:
        raise _no_rows(path, "jsonl", shape)


def _read_csv(path: str, source: Source, shape: str) -> Iterator[tuple[str, dict | DataError]]:
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))   # whole documents in one cell
    with _open_binary(path) as binary:
        reader = csv.reader(io.TextIOWrapper(binary, encoding="utf-8-sig", newline=""))
        header, seen = None, 0
        while True:
            start = reader.line_num + 1
            record = next(reader, None)
            if record is None:
                break
            if not record:                     # a blank line
                continue
            if header is None:
                header = record
                twice = sorted({c for c in header if header.count(c) > 1})
                if twice:
                    raise DataError(f"{path} line {start}: the header names column(s) {', '.join(twice)} twice")
                _check_columns(path, header, source, shape)
                continue
            seen += 1
            end = reader.line_num
            where = f"{path} line {start}" if end == start else f"{path} lines {start}-{end}"
            if len(record) != len(header):
                yield where, DataError(f"{where}: {len(record)} fields, but the header has {len(header)}")
                continue
            yield where, dict(zip(header, record))
        if not seen:
            raise _no_rows(path, "csv", shape)


def _read_text(path: str, unit: str) -> Iterator[tuple[str, dict | DataError]]:
    with _open_binary(path) as handle:
        if unit == "file":
            try:
                document = handle.read().decode("utf-8-sig")
            except UnicodeDecodeError as exc:
                yield path, DataError(f"{path}: not valid UTF-8 ({exc.reason} at byte {exc.start})")
                return
            if not document.strip():
                yield path, DataError(f"{path}: empty file (expected a non-empty text document)")
                return
            yield path, {"text": document}
            return
        n, lines, broken = 0, [], None
        for line_no, raw in enumerate(handle, start=1):
            if not raw.strip():
                if lines or broken:
                    n += 1
                    where = f"{path} paragraph {n}"
                    yield where, DataError(f"{where}: {broken}") if broken else {"text": "\n".join(lines)}
                    lines, broken = [], None
                continue
            try:
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                broken = broken or f"line {line_no} is not valid UTF-8 ({exc.reason} at column {exc.start + 1})"
                continue
            lines.append(line.rstrip("\r\n"))
        if lines or broken:
            n += 1
            where = f"{path} paragraph {n}"
            yield where, DataError(f"{where}: {broken}") if broken else {"text": "\n".join(lines)}
        if not n:
            yield path, DataError(f"{path}: empty file (expected text paragraphs separated by blank lines)")


def _read_parquet(path: str, source: Source, shape: str) -> Iterator[tuple[str, dict | DataError]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found")
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    try:
        if parquet.metadata.num_rows == 0:
            raise _no_rows(path, "parquet", shape)
        _check_columns(path, parquet.schema_arrow.names, source, shape)
        batches = parquet.iter_batches(batch_size=BATCH_ROWS)
        n = 0
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as exc:
                raise DataError(f"{path}: not a readable Parquet file (after row {n}: {exc})") from None
            if batch is None:
                return
            for row in batch.to_pylist():
                n += 1
                yield f"{path} row {n}", row
    finally:
        parquet.close()


def _read_dataset(name: str, source: Source, shape: str) -> Iterator[tuple[str, dict | DataError]]:
    import datasets

    label = f"dataset {name}{'/' + source.subset if source.subset else ''}[{source.split}]"
    try:
        if os.path.isdir(name) and _is_saved_dataset(Path(name)):
            data = datasets.load_from_disk(name)
            if isinstance(data, datasets.DatasetDict):
                if source.split not in data:
                    raise DataError(f"dataset {name}: no split '{source.split}' (splits: {_names(data)})")
                data = data[source.split]
        else:
            data = datasets.load_dataset(name, source.subset, split=source.split, streaming=True)
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - datasets raises many kinds; each is a data problem here
        raise DataError(f"dataset {name}: could not load it ({type(exc).__name__}: {exc})") from exc
    data = data.with_format(None)             # plain Python rows even if saved with set_format("torch")
    if getattr(data, "column_names", None):
        _check_columns(label, list(data.column_names), source, shape)
    rows, n = iter(data), 0
    while True:
        try:
            row = next(rows, None)
        except Exception as exc:  # noqa: BLE001 - e.g. a streamed shard that fails to download or decode
            raise DataError(f"{label} row {n + 1}: could not read it ({type(exc).__name__}: {exc})") from exc
        if row is None:
            break
        n += 1
        yield f"{label} row {n}", row
    if not n:
        raise _no_rows(label, "datasets", shape)


def _records(path: str, fmt: str, source: Source, shape: str) -> Iterator[tuple[str, dict | DataError]]:
    if fmt == "datasets":
        yield from _read_dataset(path, source, shape)
        return
    if fmt == "parquet":
        yield from _read_parquet(path, source, shape)
        return
    readers = {"jsonl": lambda: _read_json(path, shape), "csv": lambda: _read_csv(path, source, shape),
               "text": lambda: _read_text(path, source.text_unit)}
    records = readers[fmt]()
    while True:
        try:
            item = next(records, None)
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not valid UTF-8 ({exc.reason})") from None
        except csv.Error as exc:
            raise DataError(f"{path}: not readable as CSV ({exc})") from None
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(f"{path}: could not read it ({exc})") from None
        if item is None:
            return
        yield item


def _prepare(row: dict, where: str, fmt: str, source: Source, shape: str) -> dict:
    if source.columns:
        row = _map_columns(row, source.columns, where)
    if fmt == "csv":
        _decode_json_cells(row, shape, where)
    row = shapes.normalize(row, shape, where, row_shape(source))
    if shape == "text" and source.domain is not None:
        row["domain"] = source.domain
    _check_fields(row, shape, where)
    validate_row(row, shape, where)
    return row


def iter_rows(source: Source, shape: str, on_error: str = "fail",
              bad: BadRows | None = None) -> Iterator[tuple[str, dict]]:
    """Yield ``(where, row)`` for each valid row of ``source`` in ``shape`` (text, chat, preference).

    ``on_error="fail"``: the first bad row raises DataError (file, row, field, expected vs found).
    ``on_error="skip"``: bad rows go to ``bad`` and are skipped. File-level problems raise either
    way, and so does a source with no valid row at all. Configuration problems raise RecipeError
    now; reading starts at the first ``next()`` and stops after ``source.limit`` valid rows.
    """
    if shape not in SCHEMAS:
        raise ValueError(f"unknown shape {shape!r}; expected one of {', '.join(SCHEMAS)}")
    if on_error not in ON_ERROR:
        raise RecipeError(f"on_error: unknown value {on_error!r} (expected one of {', '.join(ON_ERROR)})")
    if on_error == "skip" and bad is None:
        raise ValueError("on_error='skip' needs a BadRows to record the skipped rows in")
    label = source_label(source)
    _check_config(source, label)
    shapes.resolve(row_shape(source), shape, f"{label}: shape")
    try:
        plan = _plan(source)
    except _PlanError as exc:
        raise (DataError(str(exc)) if exc.missing else RecipeError(f"{label}: {exc}")) from None
    return _generate(source, shape, plan, on_error, bad, label)


def _generate(source: Source, shape: str, plan: list[tuple[str, str]], on_error: str,
              bad: BadRows | None, label: str) -> Iterator[tuple[str, dict]]:
    if source.limit == 0:
        return
    produced, skipped, first = 0, 0, None
    for path, fmt in plan:
        for where, item in _records(path, fmt, source, shape):
            if isinstance(item, DataError):
                error = item
            else:
                try:
                    row = _prepare(item, where, fmt, source, shape)
                except DataError as exc:
                    error = exc
                else:
                    yield where, row
                    produced += 1
                    if source.limit is not None and produced >= source.limit:
                        return
                    continue
            if on_error == "fail":
                raise error
            bad.add(where, error)
            skipped += 1
            first = first or str(error)
    if not produced:
        plural = "s" if skipped != 1 else ""
        raise DataError(f"{label}: no valid rows ({skipped} bad row{plural} skipped; the first: {first})")
