"""Rows of training or evaluation data from a file or a Hugging Face dataset, as plain Python dicts.

One parser, `read_numbered`, for everything that reads records (SFT conversations, RL prompts, eval sets, the
data commands): it returns each row with its 1-based line (jsonl) or position (other inputs), so every skipped
row can be reported by where it sits; `read_rows` is the same without the numbers. It accepts ``.jsonl`` (one
JSON object per line), ``.json`` (one list of objects; or JSON lines under that name, as some publishers ship them,
Kwai-Klear's validation set ``aime960_math_verify.json`` among them: read and numbered as ``.jsonl``), ``.parquet``
(through pyarrow), and a Hugging Face ``datasets`` name, a folder written by ``Dataset.save_to_disk``, or a folder
of data files as the Hub ships a dataset (what ``huggingface-cli download --repo-type dataset`` writes: parquet or
JSON shards, split by their names or the card's ``configs``), its files of a split told by ``datasets`` and each read
here as the file it is. A dataset of several splits is read as ``SOURCE:SPLIT`` (``data/gsm8k:test``), one of several
configs as ``SOURCE:CONFIG:SPLIT`` (``openai/gsm8k:main:test``). pyarrow and datasets are imported only when such an
input is read, so the core install does not need them.

A ``.jsonl`` or ``.json`` file may be compressed as publishers ship it (``HumanEval.jsonl.gz``): gzip, bzip2 or xz,
told by its last suffix (`COMPRESSIONS`, the standard library's decompressors) and read as the file inside it, lines
numbered as in the decompressed text. A compressed stream that is damaged or cut short (an interrupted download) is
a `DataError` naming the file and the last whole line, never a partial read. `write_jsonl` compresses the same way
when the name it writes to ends in one of these suffixes, so a command's ``--out rows.jsonl.gz`` is read back.
`written` writes a file whole or not at all, beside its place and then renamed: the data commands' outputs, a run's
reports, the tokenized SFT sets.

What was simplified, and why: every input is read into memory as a list of dicts. The SFT and RL sets this
project trains on (tens to a few hundred thousand rows) fit comfortably, and a list makes shuffling, packing and
mixing plain Python; streaming would be the next step for corpora that do not fit.

A row that is a JSON list of objects (Open-Reasoner-Zero's training rows are two-message lists) is kept as
``{"turns": [...]}``, so every row is a dict; `klear.data.layouts` reads such rows.

Broken rows are never dropped silently: a jsonl line that is not valid JSON, not UTF-8, or not an object (nor a list
of objects), or that holds an integer longer than Python reads, nesting deeper than Python's JSON reader allows or
an unpaired surrogate escape (``"\\ud800"``, a string that is no text: `klear.data.json_text`), is a `BadRow`;
`read_rows` skips it with a logging warning naming the file and line (the first `MAX_ROW_WARNINGS` of them,
`warn_bad_rows`), and a summary warning gives the total. Blank lines are not rows and are skipped without a warning.
A UTF-8 byte-order mark at the start of a file (what some Windows editors write) is read as the encoding mark it is,
not as part of the first row. A missing or unreadable file, an input of no accepted format, or a path that is
neither a file nor a folder (a named pipe, a device: refused before it is opened, as reading one could wait
forever), raises `DataError` with one line naming it and what is wrong.
"""

from __future__ import annotations

import bz2
import errno
import gzip
import io
import json
import logging
import lzma
import os
import re
import stat
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from klear.data.json_text import UnusableJSON, json_error_reason, parse_json, parse_json_items
from klear.errors import UserError, first_line

logger = logging.getLogger(__name__)

ACCEPTED_FORMATS = (
    ".jsonl (one JSON object per line), .json (a list of objects, or one per line), either of them gzip, bzip2 or "
    "xz compressed (.jsonl.gz, .json.bz2, .jsonl.xz, ...), .parquet, or a Hugging Face datasets name, save_to_disk "
    "folder or downloaded dataset folder (SOURCE:SPLIT for one of its splits, SOURCE:CONFIG:SPLIT of a config)"
)
JSON_SHAPES = "a .json input is one list of objects, or one object per line"
"""What a ``.json`` file may hold, said by its errors."""
COMPRESSIONS = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz"}
"""The compressed inputs read (and outputs written) by their last suffix, and the name of each compression."""
_DECOMPRESSION_ERRORS = (EOFError, zlib.error, lzma.LZMAError)
"""What a damaged or truncated stream raises besides an ``OSError`` (gzip's ``BadGzipFile``, bz2's invalid data)."""
MAX_ROW_WARNINGS = 10
"""Broken rows warned about one by one per file; the rest are only counted in the summary warning."""
_DATASETS_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")
_SHIPPED_FILES = ("*.parquet", "*.jsonl", "*.json", "*.jsonl.gz", "*.json.gz")
"""Data files that make a folder a dataset as the Hub ships it (read by ``datasets``' packaged builders)."""
_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
_WITH_SPLIT = re.compile(rf"(?P<source>.+):(?P<split>{_NAME})")
"""``SOURCE:SPLIT``: one split of a dataset of several (or, where the dataset has several configs, one config)."""
_WITH_CONFIG = re.compile(rf"(?P<source>.+):(?P<config>{_NAME}):(?P<split>{_NAME})")
"""``SOURCE:CONFIG:SPLIT``: one split of one config of a dataset of several configs (GSM8K's ``main:test``)."""
_SPECIAL_FILES = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class DataError(UserError):
    """A data input that cannot be read: missing, unreadable, of an unknown format, or without a needed field."""


@dataclass(frozen=True)
class BadRow:
    """A row that was skipped: where it sits in ``path`` (1-based jsonl line, else 1-based position) and why."""

    path: str
    line: int
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


def read_rows(path: str | Path, split: str | None = None) -> list[dict]:
    """Every row of ``path`` as a dict, broken rows skipped with a warning naming their line.

    Args:
        path: a ``.jsonl``, ``.json`` or ``.parquet`` file; a folder saved with ``datasets``' ``save_to_disk``;
            or a dataset name for ``datasets.load_dataset`` (e.g. ``"org/name"``, needs the network); a dataset's
            split named in it as ``SOURCE:SPLIT``, or of one of its configs as ``SOURCE:CONFIG:SPLIT``.
        split: the split of a ``datasets`` input (``"train"``); optional when it has exactly one split. Files
            have no splits, so passing one with a file is an error.
    """
    rows, bad = read_numbered(path, split)
    warn_bad_rows(bad, totals={str(path): len(rows) + len(bad)})
    return [row for _, row in rows]


def read_numbered(
    path: str | Path, split: str | None = None, first: int = 0
) -> tuple[list[tuple[int, dict]], list[BadRow]]:
    """``([(line, row), ...], bad_rows)`` of ``path``, for callers that report rows by where they sit.

    For a ``.jsonl`` file the number is the line of the file (1-based, blank lines counted), the number an editor
    shows; for the other inputs it is the row's 1-based position. A jsonl line that is not a JSON object, or a
    ``.json`` list item that is not an object, is a `BadRow`. ``first > 0``: the first rows alone, that many, good
    or bad (a ``.jsonl`` or ``.parquet`` file is read no further). Raises `DataError` (one line) for a missing or
    unreadable input or one of no accepted format.
    """
    if first > 0:
        rows, bad = _read_numbered(path, split, first)
        if len(rows) + len(bad) <= first:
            return rows, bad
        last = sorted([line for line, _ in rows] + [row.line for row in bad])[first - 1]
        return [(line, row) for line, row in rows if line <= last], [row for row in bad if row.line <= last]
    text = str(path)
    local = Path(os.path.expanduser(text))
    refuse_special_file(local, text)
    kept = _KEPT.pop((text, split), None)
    if kept is not None and kept[0] == file_signature(local):
        return kept[1]
    return _read_numbered(path, split)


def _read_numbered(path: str | Path, split: str | None, first: int = 0) -> tuple[list[tuple[int, dict]], list[BadRow]]:
    """`read_numbered`, read now (a ``.jsonl`` file no further than its ``first`` rows when > 0)."""
    text = str(path)
    local = Path(os.path.expanduser(text))
    refuse_special_file(local, text)
    config = None
    if split is None and not local.exists() and (named := _named_split(text)):
        text, config, split = named
        local = Path(os.path.expanduser(text))
        refuse_special_file(local, text)
    if local.is_dir():
        if not any((local / marker).is_file() for marker in _DATASETS_MARKERS):
            return _read_shipped(text, local, split, config)
        if config is not None:
            raise DataError(f"{text}: a folder save_to_disk wrote has no configs; drop :{config} ({text}:{split})")
        return _numbered(_read_datasets(text, local, split))
    suffix = data_suffix(local)
    if suffix in (".jsonl", ".json", ".parquet"):
        if split is not None:
            named = f"split={split!r}" if config is None else f"config={config!r} and split={split!r}"
            raise DataError(f"{text}: {named} only applies to a Hugging Face dataset, not to a {suffix} file")
        if not local.is_file():
            raise DataError(f"{text}: no such file; accepted inputs: {ACCEPTED_FORMATS}")
        if suffix == ".jsonl":
            return _read_jsonl(local, text, first=first)
        if suffix == ".json":
            return _read_json(local, text)
        return _numbered(_read_parquet(local, first))
    if local.exists() or suffix or _looks_like_path(text):
        raise DataError(f"{text}: not a readable data input; accepted inputs: {ACCEPTED_FORMATS}")
    return _numbered(_read_datasets(text, None, split, config))


def _named_split(text: str) -> tuple[str, str | None, str] | None:
    """``(source, config, split)`` of ``SOURCE:SPLIT`` or ``SOURCE:CONFIG:SPLIT`` (the first where ``SOURCE:CONFIG``
    is a path that exists), or None when ``text`` names no split."""
    two = _WITH_SPLIT.fullmatch(text)
    if two is None:
        return None
    three = _WITH_CONFIG.fullmatch(text)
    if three is None or Path(os.path.expanduser(two["source"])).exists():
        return two["source"], None, two["split"]
    return three["source"], three["config"], three["split"]


def keep_read(path: str | Path, split: str | None = None) -> tuple[list[tuple[int, dict]], list[BadRow]]:
    """`read_numbered` of ``path``, kept for the next `read_numbered` of the same input, which takes it (once) while
    the file is unchanged: ``klear.fit`` checks its data before importing torch (`klear.data.preflight`), and the
    stage that tokenizes the rows after the model is loaded gets them without reading or parsing them again."""
    read = read_numbered(path, split)
    _KEPT[(str(path), split)] = (file_signature(path), read)
    return read


_KEPT: dict[tuple[str, str | None], tuple[tuple[int, int] | None, tuple]] = {}
"""``(input, split)`` -> (its `file_signature` when kept, the rows read): what `keep_read` keeps for the next read."""


def data_suffix(path: str | Path) -> str:
    """The format suffix of a data file, lower-case: ``.jsonl`` for ``rows.jsonl`` and for ``rows.jsonl.gz`` (a
    compressed ``.jsonl`` or ``.json`` reads as the file inside it); both suffixes of another compressed file
    (``.parquet.gz``, not an accepted input); ``""`` when there is none."""
    path = Path(path)
    inner = _uncompressed(path)
    if inner == path or inner.suffix.lower() in (".jsonl", ".json"):
        return inner.suffix.lower()
    return (inner.suffix + path.suffix).lower()


def data_stem(path: str | Path) -> str:
    """A data file's name without its format and compression suffixes: ``aime24`` for ``aime24.jsonl.gz``."""
    return _uncompressed(Path(path)).stem


def _uncompressed(path: Path) -> Path:
    """``path`` without its compression suffix (one of `COMPRESSIONS`), or ``path`` when it has none."""
    return path.with_suffix("") if path.suffix.lower() in COMPRESSIONS else path


@contextmanager
def open_data(path: str | Path, mode: str = "rb") -> Iterator[IO[bytes]]:
    """``path`` opened in binary ``mode`` (``"rb"`` or ``"wb"``), through the compression its last suffix names
    (`COMPRESSIONS`), else as it is; closed on leaving. A gzip file is written without a name or time in its header,
    so the same rows give the same bytes."""
    path = Path(path)
    compression = COMPRESSIONS.get(path.suffix.lower())
    with path.open(mode) as raw:
        if compression is None:
            yield raw
        elif compression == "gzip":
            with gzip.GzipFile(filename="", mode=mode, fileobj=raw, mtime=0) as file:
                yield file
        else:
            with (bz2.BZ2File if compression == "bzip2" else lzma.LZMAFile)(raw, mode) as file:
                yield file


def read_data_bytes(path: str | Path) -> bytes:
    """The whole (decompressed) content of the data file ``path``; `DataError` (one line) when it cannot be read, is
    not a file (`refuse_special_file`) or its compressed stream is damaged."""
    refuse_special_file(Path(path))
    try:
        with open_data(path) as file:
            return file.read()
    except (OSError, *_DECOMPRESSION_ERRORS) as error:
        raise _read_error(Path(path), error) from None


def special_file(path: Path) -> str | None:
    """What ``path`` is (links followed) when it exists and is neither a regular file nor a folder: ``"a named
    pipe"``, ``"a character device"``, ...; None otherwise (nothing there, a dangling link, a name the system
    refuses: the reader or the write says so)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((kind for test, kind in _SPECIAL_FILES if test(mode)), "a special file")


def written(path: Path, write) -> None:
    """``write(temporary)`` then rename it to ``path``, so that ``path`` is whole or absent (never half a file, as
    on a full disk, where the temporary one is removed and the ``OSError`` raised names ``path``).

    Only a regular file (or nothing) at ``path`` is replaced: a device, a FIFO or a socket there (or a symbolic
    link to one; ``/dev/full``, which root could otherwise replace by a file) is left alone, with an ``OSError``
    (``EEXIST``) naming ``path``, before and again just after the write."""

    def refuse_special() -> None:
        kind = special_file(path)  # nothing there yet, or a folder (the rename fails on it): None
        if kind is not None:
            raise FileExistsError(errno.EEXIST, f"Not a regular file but {kind}, which is never replaced", str(path))

    temporary = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")  # the suffix tells matplotlib the format
    try:
        refuse_special()
        write(temporary)
        refuse_special()
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise OSError(error.errno, error.strerror or str(error), str(path)) from error
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def refuse_special_file(path: Path, name: str | None = None) -> None:
    """`DataError` (one line, naming ``name``, else ``path``) when ``path`` is a `special_file`: a named pipe, a
    device or a socket, which would be read forever or block until a writer comes, and which is no data file to
    check before training."""
    kind = special_file(path)
    if kind is not None:
        raise DataError(f"{path if name is None else name}: is {kind}, not a file; a data input is read from a file")


def file_signature(path: str | Path) -> tuple[int, int] | None:
    """Modification time and size of a local input (None for a dataset name): a kept read of a file that changed
    since is not served."""
    try:
        stat = Path(os.path.expanduser(str(path))).stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def warn_bad_rows(bad: list[BadRow], totals: dict[str, int] | None = None) -> None:
    """Log the first `MAX_ROW_WARNINGS` bad rows of each input as ``path:line: skipped, reason``, then a count
    per input (of ``totals[path]`` rows, when given)."""
    by_path: dict[str, list[BadRow]] = {}
    for row in bad:
        by_path.setdefault(row.path, []).append(row)
    for path, rows in by_path.items():
        for row in sorted(rows, key=lambda r: r.line)[:MAX_ROW_WARNINGS]:
            logger.warning("%s:%d: skipped, %s", path, row.line, row.reason)
        of = f" of {totals[path]}" if totals and path in totals else ""
        shown = f" (first {MAX_ROW_WARNINGS} shown)" if len(rows) > MAX_ROW_WARNINGS else ""
        logger.warning("%s: skipped %d bad rows%s%s", path, len(rows), of, shown)


def write_jsonl(rows: Iterable[dict], path: str | Path) -> Path:
    """Write one JSON object per line (UTF-8, non-ASCII kept as is), creating parent folders, compressed when the
    name ends in one of `COMPRESSIONS`' suffixes; returns the path. A string holding an unpaired surrogate, which
    UTF-8 cannot encode, is written as its JSON escape (``\\ud800``, what ``ensure_ascii`` writes): nothing is lost,
    and reading the line back names it as the bad row it is (`parse_json`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_data(path, "wb") as f:
        for row in rows:
            # only inside a JSON string can such a character be, where backslashreplace's \udxxx is its JSON escape
            f.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8", "backslashreplace"))
    return path


def _read_jsonl(
    path: Path, name: str, content: bytes | None = None, first: int = 0
) -> tuple[list[tuple[int, dict]], list[BadRow]]:
    """The rows of a JSON-lines file (its ``first`` rows, good or bad, when > 0); of ``content``, its (decompressed)
    bytes, when they were read already."""
    rows, bad = [], []
    for number, entry in jsonl_entries(path, name, content):
        if first and len(rows) + len(bad) == first:
            break
        if isinstance(entry, BadRow):
            bad.append(entry)
        else:
            rows.append((number, entry))
    return rows, bad


def jsonl_entries(path: Path, name: str, content: bytes | None = None) -> Iterator[tuple[int, dict | BadRow]]:
    """``(line, row)`` for each non-blank line of a JSON-lines file, ``(line, BadRow)`` for one that is no row, read
    as they are asked for; of ``content``, its bytes, when they were read already. `DataError` for a file that
    cannot be read on (a gzip stream cut short: at its line)."""
    number = 0
    try:
        with open_data(path) if content is None else io.BytesIO(content) as f:
            for number, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                try:
                    row = as_row(parse_json(raw.decode("utf-8-sig" if number == 1 else "utf-8")))
                except UnicodeDecodeError:
                    yield number, BadRow(name, number, "not valid JSON (not UTF-8)")
                    continue
                except json.JSONDecodeError as error:
                    yield number, BadRow(name, number, json_error_reason(error))
                    continue
                if isinstance(row, dict):
                    yield number, row
                else:
                    yield number, BadRow(name, number, f"a JSON {type(row).__name__}, not an object")
    except (OSError, *_DECOMPRESSION_ERRORS) as error:
        raise _read_error(path, error, number) from None


def _read_json(path: Path, name: str) -> tuple[list[tuple[int, dict]], list[BadRow]]:
    content = read_data_bytes(path)
    try:
        text = content.decode("utf-8-sig")
        data, item_problem = parse_json_items(text)
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except UnusableJSON as error:  # too deep: one object may be a line of JSON lines, else the file is lost
        if text.lstrip().startswith("{"):  # an object is no .json input but as JSON lines
            return _read_jsonl(path, name, content)
        raise DataError(f"{path}: {error.msg}; {JSON_SHAPES}") from None
    except json.JSONDecodeError as error:
        if error.msg == "Extra data" and text.lstrip().startswith("{"):  # objects one after another: JSON lines
            return _read_jsonl(path, name, content)
        raise DataError(f"{path}:{error.lineno}: not valid JSON ({error.msg}); {JSON_SHAPES}") from None
    if isinstance(data, dict) and "\n" not in text.strip():  # JSON lines of one row
        return _read_jsonl(path, name, content)
    if not isinstance(data, list):
        raise DataError(f"{path}: a JSON {type(data).__name__}; {JSON_SHAPES}")
    rows, bad = [], []
    for position, item in enumerate(data, start=1):
        item = as_row(item)
        problem = item_problem(item)
        if problem is not None:
            bad.append(BadRow(name, position, f"item {position} {problem}"))
        elif isinstance(item, dict):
            rows.append((position, item))
        else:
            bad.append(BadRow(name, position, f"item {position} is a JSON {type(item).__name__}, not an object"))
    return rows, bad


def as_row(value: object) -> object:
    """A JSON list of objects as the row ``{"turns": [...]}``; anything else unchanged."""
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return {"turns": value}
    return value


def _numbered(rows: list[dict]) -> tuple[list[tuple[int, dict]], list[BadRow]]:
    return list(enumerate(rows, start=1)), []


def _read_parquet(path: Path, first: int = 0) -> list[dict]:
    """The rows of a parquet file; its ``first`` rows alone when > 0, decoded no further than the row groups that
    hold them (a look at a code set of gigabytes of tests takes a moment)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        message = f"{path}: reading parquet needs pyarrow: pip install pyarrow (or pip install 'klear[data]')"
        raise DataError(message) from None
    try:
        if not first:
            return pq.read_table(path).to_pylist()
        with pq.ParquetFile(path) as parquet:
            return next(parquet.iter_batches(batch_size=first), parquet.schema_arrow.empty_table()).to_pylist()
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(f"{path}: cannot read as parquet ({error})") from None


def _read_datasets(name: str, folder: Path | None, split: str | None, config: str | None = None) -> list[dict]:
    """The rows of a ``save_to_disk`` folder (``folder``) or of a hub dataset ``name`` (of ``config``, when it has
    several), of ``split``."""
    datasets = _datasets(name)
    from klear.runtime.hub import check_hub_access

    label = name
    try:
        if folder is not None:
            loaded = datasets.load_from_disk(str(folder))
        else:  # ask for the split directly, so the other splits are not downloaded
            check_hub_access(name, "dataset")  # no network retries on a machine without the Hub
            config, split = _pick_config(name, datasets, config, split)
            label = name if config is None else f"{name}:{config}"
            loaded = datasets.load_dataset(name, config, split=split)
            split = None
    except DataError:
        raise
    except Exception as error:  # datasets raises many unrelated types (hub, network, file errors)
        raise DataError(f"{name}: datasets could not load it ({type(error).__name__}: {first_line(error)})") from None
    if isinstance(loaded, datasets.DatasetDict):
        loaded = loaded[_one_split(label, sorted(loaded), split)]
    elif split is not None:
        raise DataError(f"{name}: a single dataset without splits; drop split={split!r}")
    return loaded.to_list()


def _read_shipped(
    name: str, folder: Path, split: str | None, config: str | None
) -> tuple[list[tuple[int, dict]], list[BadRow]]:
    """The rows of ``split`` (of ``config``, when the card declares several) of a dataset folder as the Hub ships
    it: its files of that split, as ``datasets`` resolves them (by their names, or the card's ``configs``), each read
    as the file it is, in order, numbered by their position in the split; a bad row of a jsonl shard names that
    shard and its line."""
    if not any(next(folder.rglob(files), None) for files in _SHIPPED_FILES):
        raise DataError(
            f"{name}: a folder that holds no data files and that save_to_disk did not write; accepted inputs: "
            f"{ACCEPTED_FORMATS}"
        )
    datasets = _datasets(name)
    from klear.runtime.logs import quiet

    try:
        with quiet("huggingface_hub.repocard"):  # a card without metadata is no news
            config, split = _pick_config(name, datasets, config, split, str(folder))
            splits = _config_splits(datasets, str(folder), config, files=True)
    except DataError:
        raise
    except Exception as error:  # datasets raises many unrelated types
        raise DataError(
            f"{name}: datasets could not tell its files ({type(error).__name__}: {first_line(error)})"
        ) from None
    rows, bad = [], []
    for shard in splits[_one_split(name if config is None else f"{name}:{config}", sorted(splits), split)]:
        numbered, broken = read_numbered(shard)
        rows += [row for _, row in numbered]
        bad += broken
    return _numbered(rows)[0], bad


def _pick_config(
    name: str, datasets: Any, config: str | None, split: str | None, path: str | None = None
) -> tuple[str | None, str | None]:
    """``(config, split)`` to read of the dataset at ``path`` (a folder, else the hub dataset ``name``): the named
    config, or the one ``SOURCE:NAME`` names when ``NAME`` is a config of several (with no split yet), or None for
    the dataset's own default; `DataError` saying how to name one when it has several and no default."""
    path = name if path is None else path
    try:
        configs = datasets.get_dataset_config_names(path)
    except Exception:  # a hub dataset that datasets reads offline from its own cache lists none: read as named
        return config, split
    if config is not None:
        if config not in configs:
            example = _config_example(datasets, name, path, configs[0], split)
            raise DataError(f"{name}: no config {config!r}; it has {configs} ({example})")
        return config, split
    if split in configs:
        return split, None
    if len(configs) < 2:
        return None, split
    if datasets.get_dataset_default_config_name(path) is None:
        example = _config_example(datasets, name, path, configs[0], split)
        raise DataError(f"{name}: has configs {configs}; name one and its split: {example}")
    return None, split


def _one_split(name: str, splits: list[str], split: str | None) -> str:
    """``split``, or the only one of ``splits`` when none is named; `DataError` saying how to name one."""
    if split is None and len(splits) != 1:
        raise DataError(f"{name}: has splits {splits}; name one after a colon: {name}:{splits[-1]}")
    if split is not None and split not in splits:
        raise DataError(f"{name}: no split {split!r}; it has {splits} ({name}:{splits[-1]})")
    return splits[0] if split is None else split


def _config_splits(datasets: Any, path: str, config: str | None, files: bool = False) -> Any:
    """The splits of ``config`` of the dataset at ``path`` (sorted names), or with ``files`` each split's data files,
    as ``datasets`` resolves them without reading them (nor leaving a lock file in its cache, as a builder does)."""
    with tempfile.TemporaryDirectory(prefix="klear-datasets-") as cache:
        found = datasets.load_dataset_builder(path, config, cache_dir=cache).config.data_files or {}
    by_split = {str(key): value for key, value in found.items()}
    return by_split if files else sorted(by_split)


def _config_example(datasets: Any, name: str, path: str, config: str, split: str | None = None) -> str:
    """``NAME:CONFIG:SPLIT`` with ``split`` when ``config`` has it, else one of its own splits, to show how a config
    is named."""
    try:
        splits = _config_splits(datasets, path, config)
    except Exception:  # only an example for an error line: the error is the line's own
        splits = []
    return f"{name}:{config}:{split if split in splits else splits[-1] if splits else 'SPLIT'}"


def _datasets(name: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{name}: reading a Hugging Face dataset needs datasets: pip install datasets") from None
    return datasets


def _read_error(path: Path, error: BaseException, lines: int = 0) -> DataError:
    """The one-line error of an input that could not be read: the file itself (missing, a folder, a disk error: an
    ``OSError`` with an errno), or a compressed stream that is not whole, with how many lines (of a jsonl file) came
    before the break."""
    if isinstance(error, OSError) and error.errno is not None:
        return _unreadable(path, error)
    where = f" after line {lines}" if lines else ""
    return DataError(
        f"{path}: not a whole {COMPRESSIONS.get(path.suffix.lower(), 'compressed')} stream "
        f"({str(error) or type(error).__name__}){where}: damaged or cut short, so none of it is used"
    )


def _unreadable(path: Path, error: OSError) -> DataError:
    return DataError(f"{path}: cannot read ({error.strerror or error}); accepted inputs: {ACCEPTED_FORMATS}")


def _looks_like_path(text: str) -> bool:
    """Whether a missing input was meant as a local path rather than a hub name such as ``org/name``."""
    return text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text
