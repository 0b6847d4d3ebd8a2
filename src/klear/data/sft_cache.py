"""Tokenized SFT sets kept on disk (``data.cache_dir``), so that a set is tokenized once, not at every start.

Tokenizing is most of what an SFT run does before its first step, and it is done again at every ``--resume``, by
every rank of a machine and by every run of a sweep over the same rows: at Klear-Reasoner's scale (10^10 tokens) it
is hours each time. With ``data.cache_dir`` set, `tokenized_set` keeps each set's examples and what was done with its
rows in one file there, ``sft-<key>.npz`` (numpy's format: ``ids``, ``learned``, ``starts``, ``record``), and the
next start with the same key reads it back instead.

The key is a hash of everything the examples are made from, so a changed input is tokenized again, never served
stale: every row read and its line, the set's source as written (bad rows are reported by it), the settings that
shape the examples (``data.max_length``, ``truncation``, ``thought_markers``, the layout and its keys: every
``data.*`` key but those that only draw, batch or name the rows, `UNKEYED`), the tokenizer (its whole serialized
``tokenizers`` state, chat template and special tokens), the versions of transformers, tokenizers, jinja2 and
numpy, and the source of klear's data code. Hashing the rows costs about 1/40 of tokenizing them; a tokenizer that
has no serialized state (not a fast one) keeps its sets out of the cache, and the log says so.

A local data file unchanged since its set was kept is not read again: `remember_set` notes beside the entry
(``sft-<key>.json``) that the file of that stamp (`source_stamp`: real path, inode, size, ``mtime`` and ``ctime``,
which every write sets and no copy sets back), read with the same settings and tokenizer, is that set, and
`known_set` finds it from the stamp alone, so no process reads, parses or holds the rows (a file changed in the last
`RACY_S` is read, as git reads its "racily clean" files).

A file is written beside its place and renamed into it whole, with a checksum of each array in its record, so a
stop, a full disk or a copy cut short never leaves an entry that reads as good: a damaged entry is reported in one
line and the set tokenized again (and the entry replaced). A cache that cannot be written costs its gain, nothing
else: the run goes on with a warning. Processes of one machine that load the same set together (the ranks of a
run) take a lock on its entry, so one tokenizes and the others read what it wrote. An entry is memory-mapped, not
copied (`mapped_member`), by the process that wrote it as by those that read it: its pages are the page cache's,
held once for every process that maps it, so a machine's 8 ranks hold one copy of a set instead of 8 (entries are
only ever replaced whole, never written in place, so a mapped file never changes under a run). Nothing is written
to the run's ``output_dir``; entries are never removed by klear (about 5 bytes a token: remove old ``sft-*.npz`` by
hand, a used entry's time is refreshed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import logging
import os
import stat
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from klear.data.chat_template import TemplateTraits
from klear.data.example_store import Examples
from klear.data.readers import BadRow, written
from klear.data.sft import SFTStats
from klear.errors import first_line

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

FORMAT = 1
"""The layout of an entry; a new one makes every old entry a miss."""
UNKEYED = frozenset(
    {"train", "eval", "num_eval", "num_train", "levels", "plain_fraction", "batching", "batch_size"}
    | {"micro_batch_size", "cache_dir"}
)
"""``data.*`` keys left out of the key: which sets there are (each is keyed by its own source and rows), what only
draws the rows (the rows themselves are hashed) and how examples are batched. Every other key is in it."""
RACY_S = 2.0
"""A file changed less than this many seconds before it is read is not known by its stamp (`source_stamp`): another
change within the same tick of a coarse clock would leave the stamp as it was (git's "racily clean" files)."""
_TOKENIZER_SETTINGS = ("add_bos_token", "add_eos_token", "split_special_tokens", "clean_up_tokenization_spaces")
_PACKAGES = ("transformers", "tokenizers", "jinja2", "numpy")
ZIP_MAGIC = b"PK\x03\x04"
"""How an ``.npz`` file (a zip archive) begins."""


@dataclasses.dataclass
class TokenizedSet:
    """A set's examples and what was done with its rows, as `klear.data.sft.build_sft_examples` made them."""

    examples: Examples
    stats: SFTStats
    digest: str
    """``examples.digest()``, the content digest ``data_report.json`` records."""
    read_from: Path | None = None
    """The cache entry it was read from; None: tokenized here."""
    kept: Path | None = None
    """The cache entry that holds it (read from, or written now); None: not kept."""


def tokenized_set(
    cache_dir: str,
    key_parts: dict[str, Any],
    rows: Sequence[dict],
    lines: Sequence[int],
    tokenizer: PreTrainedTokenizerBase,
    build: Callable[[], tuple[Examples, SFTStats]],
    label: str,
) -> TokenizedSet:
    """The examples ``build()`` makes of ``rows``, read from ``cache_dir`` when an entry of the same key is there
    (``key_parts``: the source and settings, see the module docstring), else built and written there. ``cache_dir``
    "" (the default of ``data.cache_dir``) builds without a cache. ``label`` names the set in the log."""
    if not cache_dir:
        return _built(build)
    tokens = tokenizer_fingerprint(tokenizer)
    if tokens is None:
        log.info(
            "%s: not kept in data.cache_dir: %s has no serialized state to key it by", label, type(tokenizer).__name__
        )
        return _built(build)
    folder = Path(os.path.expanduser(cache_dir))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        log.warning("data.cache_dir %r cannot be used (%s); %s is tokenized without it", cache_dir, _why(error), label)
        return _built(build)
    key = entry_key(key_parts, rows, lines, tokens)
    path = folder / f"sft-{key}.npz"
    with _locked(path.with_suffix(".lock"), label):
        if path.exists():
            try:
                found = read_entry(path, key)
            except Exception as error:  # any damage alike: a cut zip, a bad record, a checksum
                log.warning("%s: the cache entry %s is damaged (%s); tokenizing again", label, path, _why(error))
            else:
                with contextlib.suppress(OSError):
                    os.utime(path)  # a used entry is a recent one, for whoever prunes the cache by age
                return found
        made = _built(build)
        try:
            write_entry(path, key, made)
        except OSError as error:
            log.warning("%s: not kept in data.cache_dir (%s writing %s); the run goes on", label, _why(error), path)
            return made
        try:
            kept = read_entry(path, key)
        except Exception as error:  # written whole a moment ago: only a filesystem that loses writes gets here
            log.warning("%s: %s does not read back (%s); the set stays in memory", label, path, _why(error))
            return made
        log.info("%s: kept in data.cache_dir: %s (%.1f MB)", label, path, path.stat().st_size / 1e6)
        # this process too maps what it kept, and lets its own copy go: one copy of the set for the whole machine
        return dataclasses.replace(made, examples=kept.examples, kept=path)


def source_stamp(source: str) -> list | None:
    """What a local file is known by without reading it, as git knows its files: its real path, inode, size and the
    times of its last change (``mtime``, and ``ctime``, which no copy or ``touch`` sets back); None for anything else
    (a built-in task, a dataset folder or hub name) and for a file changed in the last `RACY_S`. Not its device
    number, which the nodes of a cluster number each their own way for one shared filesystem (NFS gives every client
    the server's inodes and times), so that their ranks share a note."""
    path = Path(os.path.expanduser(source))
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # before the open: a device or a FIFO is never opened
            return None
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # an open revalidates NFS's cached attributes
        try:
            status = os.fstat(handle)
        finally:
            os.close(handle)
        real = str(path.resolve())
    except (OSError, RuntimeError):
        return None
    if not stat.S_ISREG(status.st_mode) or time.time_ns() - max(status.st_mtime_ns, status.st_ctime_ns) < RACY_S * 1e9:
        return None
    return [real, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns]


def known_set(
    cache_dir: str, settings: dict[str, Any], stamp: list, tokens: str
) -> tuple[TokenizedSet, dict[str, Any], list[BadRow]] | None:
    """The set kept in ``cache_dir`` for the file of ``stamp`` (`source_stamp`) read with ``settings`` (the keyed
    ``data.*`` keys and the source) by the tokenizer of fingerprint ``tokens`` (`tokenizer_fingerprint`), found
    without reading the file: its examples (`read_entry`), the layout it was read in and the rows its reader skipped,
    as `remember_set` noted them; None when nothing whole is noted."""
    folder = Path(os.path.expanduser(cache_dir))
    note = folder / f"sft-{_stamp_key(settings, stamp, tokens)}.json"
    try:
        record = json.loads(note.read_text())
        if record.get("format") != FORMAT or record.get("stamp") != stamp:
            return None
        found = read_entry(folder / record["entry"], record["key"])
        bad = [BadRow(**row) for row in record["bad"]]
    except Exception as error:  # noted, then removed or damaged: the set is found by its rows instead
        log.debug("%s is not used (%s)", note, _why(error))
        return None
    for path in (note, folder / record["entry"]):
        with contextlib.suppress(OSError):
            os.utime(path)  # in use, for whoever prunes the cache by age
    return found, record["layout"], bad


def remember_set(
    settings: dict[str, Any], stamp: list, tokens: str, made: TokenizedSet, layout: dict[str, Any], bad: list[BadRow]
) -> None:
    """Note beside ``made``'s entry that the file of ``stamp``, read with ``settings`` by the tokenizer of
    fingerprint ``tokens``, is that set, read in ``layout`` with its reader skipping ``bad``, so that the next start
    finds it without reading the file (`known_set`). A note that cannot be written costs that gain only."""
    if made.kept is None:
        return
    record = {
        "format": FORMAT,
        "entry": made.kept.name,
        "key": made.kept.stem.removeprefix("sft-"),
        "stamp": stamp,
        "layout": layout,
        "bad": [row.to_dict() for row in bad],
    }
    note = made.kept.with_name(f"sft-{_stamp_key(settings, stamp, tokens)}.json")
    try:
        written(note, lambda temporary: temporary.write_text(json.dumps(record)))
    except OSError as error:
        log.debug("%s is not written (%s)", note, _why(error))


def _stamp_key(settings: dict[str, Any], stamp: list, tokenizer: str) -> str:
    header = {"format": FORMAT, "code": code_fingerprint(), "tokenizer": tokenizer, "stamp": stamp, **settings}
    return hashlib.blake2b(json.dumps(header, sort_keys=True, default=str).encode(), digest_size=16).hexdigest()


def _built(build: Callable[[], tuple[Examples, SFTStats]]) -> TokenizedSet:
    examples, stats = build()
    return TokenizedSet(examples, stats, examples.digest())


def entry_key(key_parts: dict[str, Any], rows: Sequence[dict], lines: Sequence[int], tokenizer: str) -> str:
    """The hex key of a set's entry: what `tokenized_set` says it is made from."""
    sha = hashlib.blake2b(digest_size=16)
    header = {"format": FORMAT, "code": code_fingerprint(), "tokenizer": tokenizer, **key_parts}
    sha.update(json.dumps(header, sort_keys=True, default=str).encode())
    sha.update(np.asarray(lines, dtype=np.int64).tobytes())
    for row in rows:
        sha.update(b"\n")
        text = json.dumps(row, sort_keys=True, ensure_ascii=False, default=_plain)
        sha.update(text.encode("utf-8", "surrogatepass"))  # a lone surrogate a reader kept hashes, never raises
    return sha.hexdigest()


def _plain(value: Any) -> Any:
    """A JSON form of a value a reader may leave in a row (numpy arrays: their items in full, not str's summary)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, bytes | bytearray):
        return value.hex()
    return repr(value)


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """A hash of what ``tokenizer`` turns text into: its ``tokenizers`` state (vocabulary, merges, normalizer, pre-
    and post-processor, added tokens), chat template, special tokens and encoding settings; None for a tokenizer
    without such a state."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    sha = hashlib.blake2b(backend.to_str().encode(), digest_size=16)
    settings = {name: getattr(tokenizer, name, None) for name in _TOKENIZER_SETTINGS}
    rest = [type(tokenizer).__qualname__, tokenizer.chat_template, tokenizer.special_tokens_map, settings]
    sha.update(json.dumps(rest, sort_keys=True, default=str).encode())
    return sha.hexdigest()


@functools.cache
def code_fingerprint() -> str:
    """A hash of the source of klear's data code (every module of `klear.data`, which turns rows into examples) and
    of the versions of the packages it tokenizes and renders with."""
    sha = hashlib.blake2b(digest_size=16)
    for path in sorted(Path(__file__).parent.glob("*.py")):
        sha.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for package in _PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            sha.update(f"{package}=={metadata.version(package)}\n".encode())
    return sha.hexdigest()


def write_entry(path: Path, key: str, made: TokenizedSet) -> None:
    """Write ``made`` as the entry ``path`` of ``key``, whole or not at all (`klear.data.readers.written`)."""
    arrays = dict(zip(("ids", "learned", "starts"), made.examples.arrays(), strict=True))
    record = {
        "format": FORMAT,
        "key": key,
        "digest": made.digest,
        "stats": dataclasses.asdict(made.stats),
        "checksums": {name: _checksum(array) for name, array in arrays.items()},
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
    }

    def write(temporary: Path) -> None:
        with open(temporary, "wb") as handle:
            np.savez(handle, **arrays, record=np.array(json.dumps(record)))
            handle.flush()
            os.fsync(handle.fileno())

    try:
        written(path, write)
    finally:
        arrays.clear()  # views of the examples' arrays, which must not stay exported


def read_entry(path: Path, key: str) -> TokenizedSet:
    """The set the entry ``path`` holds, its arrays mapped from the file (`mapped_member`); ValueError (or an
    OSError, or the zip reader's error) when it is not a whole entry of ``key``."""
    with open(path, "rb") as handle:
        if handle.read(4) != ZIP_MAGIC:
            raise ValueError("not an .npz file")
    with np.load(path, allow_pickle=False) as entry:
        record = json.loads(str(entry["record"]))
    if record.get("format") != FORMAT or record.get("key") != key:
        raise ValueError(f"it holds {record.get('key')!r} of format {record.get('format')!r}")
    with zipfile.ZipFile(path) as archive:
        arrays = {name: mapped_member(path, archive.getinfo(f"{name}.npy")) for name in ("ids", "learned", "starts")}
    for name, array in arrays.items():
        if _checksum(array) != record["checksums"][name]:
            raise ValueError(f"its {name} do not match their checksum")
    examples = Examples.from_arrays(arrays["ids"], arrays["learned"], arrays["starts"], copy=False)
    return TokenizedSet(examples, _stats(record["stats"]), record["digest"], read_from=path, kept=path)


def mapped_member(path: Path, member: zipfile.ZipInfo) -> np.ndarray:
    """The ``.npy`` array stored (not compressed) as ``member`` of the archive ``path``, memory-mapped read-only:
    the pages are the file's, shared by every process that maps it, and read from disk as they are used."""
    if member.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"{member.filename} is compressed")
    with open(path, "rb") as handle:
        handle.seek(member.header_offset)
        local = handle.read(30)  # a zip local file header: its name's and extra field's sizes end it
        if local[:4] != ZIP_MAGIC:
            raise ValueError(f"{member.filename} has no local header")
        handle.seek(
            member.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
        )
        version = np.lib.format.read_magic(handle)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(handle)
        offset = handle.tell()
    if len(shape) != 1 or fortran or dtype.hasobject:
        raise ValueError(f"{member.filename} is not a flat array")
    if offset + shape[0] * dtype.itemsize > path.stat().st_size:
        raise ValueError(f"{member.filename} is cut short")
    if not shape[0]:
        return np.empty(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def _checksum(array: np.ndarray) -> str:
    return f"{array.dtype.str}:{array.shape}:{hashlib.blake2b(np.ascontiguousarray(array), digest_size=16).hexdigest()}"


def _stats(fields: dict[str, Any]) -> SFTStats:
    """The `SFTStats` that ``dataclasses.asdict`` made ``fields`` of."""
    traits = fields.pop("traits")
    stats = SFTStats(**fields)
    stats.bad = [BadRow(**row) for row in stats.bad]
    if traits is not None:
        stats.traits = TemplateTraits(**{**traits, "think": tuple(traits["think"])})
    return stats


@contextlib.contextmanager
def _locked(path: Path, label: str) -> Iterator[None]:
    """Hold the lock ``path`` (made when missing) while the body runs; a filesystem without locks runs it unlocked
    (processes that build the same entry then each write it whole, the last rename wins)."""
    try:
        handle = open(path, "a")  # noqa: SIM115 - closed in the finally below
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("%s: waiting for another process tokenizing the same set into %s", label, path.with_suffix(".npz"))
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        handle.close()


def _why(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror[0].lower() + error.strerror[1:]
    return first_line(error) or type(error).__name__
