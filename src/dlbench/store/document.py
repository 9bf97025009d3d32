"""A JSON document of the store, read one way whatever kind it is: run records (store.py), kernel
records (kernels.py), machine profiles (profiles.py) and equivalence checks (checks.py).

Reading (`DocumentKind.read`): the bytes of a regular file (`read_regular`: a FIFO or a directory
is never opened), a JSON object, its version field readable by this dlbench, and its `checksum`
verified where the kind carries one. Every way a file can fail is one error of the kind's own
exception class, naming the file and what is wrong with it; `DocumentKind.validate` does the same
for the first field its pydantic model refuses. What a kind does with the data then (a record's
migrations, a profile read at the current format) is its own module's.

The checksum: "sha256:" + the SHA-256 of the canonical JSON (keys sorted, no whitespace, UTF-8) of
everything in the file but `checksum` itself. Canonical, so it does not depend on how the file was
indented or ordered, and data read and dumped again keeps it. Verifying is exact and cheap
(`_verified_fast`): orjson parses the file and writes it again with sorted keys, several times
faster than the json module; the floats it writes in another notation than json does (1e-9 for
1e-09, 0.00001 for 1e-05; always the same shortest digits) are rewritten as json writes them,
outside strings only. Those bytes hash to the stored checksum only if they are the canonical JSON
the writer hashed, and parsing them gives back what orjson read, so a match proves the content.
Anything else (no match, a file orjson refuses) is read and checked again the defining way, with
the json module, before it is called damaged: the fast way can only save time, never accept a file
the defining way would refuse.

Writing: `checksummed_file` gives the bytes of a document with its checksum stamped; the store
writes them whole or not at all (Store.publish, Store.replace).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import orjson
from pydantic import BaseModel, ValidationError

CHECKSUM_PREFIX = "sha256:"

Model = TypeVar("Model", bound=BaseModel)


class StoreError(Exception):
    pass


def read_regular(path: Path) -> bytes:
    """The bytes of a regular file; StoreError for anything else (a FIFO, a device, a directory),
    which is never read: opening a FIFO for reading blocks until a writer comes, which may be never.
    The check is made on the open descriptor too (O_NONBLOCK: opening a FIFO so returns at once),
    so a file swapped for a FIFO after the first look is refused as well."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{path}: not a regular file ({_file_kind(st.st_mode)}); ignored, never opened")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise StoreError(f"{path}: unreadable: {type(e).__name__}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{path}: not a regular file ({_file_kind(st.st_mode)}); ignored")
        chunks = []
        while chunk := os.read(fd, max(st.st_size + 1, 65536)):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise StoreError(f"{path}: unreadable: {type(e).__name__}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a plain file"


def canonical_json(data) -> bytes:
    # surrogatepass: a lone surrogate escaped in a file ("\ud800") must hash, not crash the reader
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def checksum_of(data: dict) -> str:
    """The checksum a document's data should carry (its own `checksum` field left out)."""
    body = {k: v for k, v in data.items() if k != "checksum"}
    return CHECKSUM_PREFIX + hashlib.sha256(canonical_json(body)).hexdigest()


def checksummed_file(data: dict, sort_keys: bool = False) -> bytes:
    """The bytes of a document file: `data` with its checksum last, indented by one, a final newline."""
    data = {**data, "checksum": checksum_of(data)}
    return json.dumps(data, indent=1, sort_keys=sort_keys).encode() + b"\n"


# where a number orjson writes otherwise than json may be: an exponent (json: 1e-09, 1e+16; orjson:
# 1e-9, 1e16) or a small number written out (json: 1e-05; orjson: 0.00001). Found by their literal
# part, which the re module and bytes.find scan for quickly; the whole number is then matched.
_EXPONENT = re.compile(rb"e[-+]?[0-9]")
_SMALL = b"0.0000"
_NUMBER = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?(?=[,\]}])")
_NUMBER_BYTES = frozenset(b"0123456789.-")


def _number_starts(out: bytes) -> list[int]:
    starts = set()
    anchors = [m.start() for m in _EXPONENT.finditer(out) if m.start() and out[m.start() - 1] in b"0123456789"]
    at = out.find(_SMALL)
    while at != -1:
        anchors.append(at)
        at = out.find(_SMALL, at + len(_SMALL))
    for at in anchors:
        while at and out[at - 1] in _NUMBER_BYTES:
            at -= 1
        starts.add(at)
    return sorted(starts)


def _canonical_fast(body: dict) -> bytes | None:
    """canonical_json(body) by way of orjson (None where orjson cannot write it): orjson's sorted
    output with each float in the notation json uses. A number-like text inside a string is left
    alone: strings are told apart by counting the quotes before it, once escaped quotes and
    backslashes are blanked out (same length, so positions still line up)."""
    try:
        out = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):  # an int beyond 64 bits, a lone surrogate, deep nesting
        return None
    quotes = out.replace(b"\\\\", b"\0\0").replace(b'\\"', b"\0\0") if b"\\" in out else out
    parts, copied, counted, inside = [], 0, 0, False
    for start in _number_starts(out):
        inside ^= quotes.count(b'"', counted, start) % 2 == 1
        counted = start
        number = None if inside or out[start - 1:start] not in (b":", b",", b"[") else _NUMBER.match(out, start)
        if number is not None:  # outside strings every number follows one of those and ends before , ] }
            parts += (out[copied:start], repr(float(number[0])).encode())
            copied = number.end()
    if not parts:
        return out
    parts.append(out[copied:])
    return b"".join(parts)


def _verified_fast(raw: bytes) -> dict | None:
    """The file's data if orjson can show it matches its own checksum; None: decide the slow way."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    stored = data.get("checksum") if isinstance(data, dict) else None
    if not isinstance(stored, str) or not stored.startswith(CHECKSUM_PREFIX):
        return None
    canonical = _canonical_fast({k: v for k, v in data.items() if k != "checksum"})
    if canonical is None or CHECKSUM_PREFIX + hashlib.sha256(canonical).hexdigest() != stored:
        return None
    return data


@dataclass(frozen=True)
class Document:
    """One file as read: its bytes, its data (the checksum included), the version it says it was
    written at (None for a kind without one) and whether its checksum was verified."""

    path: Path
    raw: bytes
    data: dict
    version: int | None
    verified: bool

    def body(self, file_fields: Collection[str] = ("checksum",)) -> dict:
        """The data without the fields that belong to the file rather than to its model."""
        return {k: v for k, v in self.data.items() if k not in file_fields}


@dataclass(frozen=True)
class DocumentKind:
    """How one kind of document is read, and what its errors call it.

    `noun` names the kind in errors ("kernel record"); `error` is the exception class its readers
    catch. `version_field` (None: the kind has none) must hold one of `readable_versions`.
    `checksummed_from`: the version from which every file carries a checksum (an older one never
    had one and reads as unverified); 0 for every file; None for a kind written without one, whose
    `checksum` field, if any, is then data like any other."""

    noun: str
    error: type[Exception] = StoreError
    version_field: str | None = None
    readable_versions: Collection[int] = ()
    checksummed_from: int | None = 0

    def read(self, path: Path) -> Document:
        """Read and verify one file (see the module docstring); `error` naming it otherwise."""
        path = Path(path)
        try:
            raw = read_regular(path)
        except StoreError as e:
            raise self.error(str(e)) from None
        return self.parse(path, raw)

    def parse(self, path: Path, raw: bytes) -> Document:
        """As `read`, of bytes already read from `path`."""
        data = _verified_fast(raw) if self.checksummed_from is not None else None
        verified = data is not None
        if data is None:
            try:
                data = json.loads(raw)
            except (ValueError, RecursionError) as e:  # ValueError: not UTF-8, not JSON
                raise self.error(f"{path}: unreadable {self.noun}: {type(e).__name__}: {e}") from None
        if not isinstance(data, dict):
            raise self.error(f"{path}: not a {self.noun} (not a JSON object)")
        version = self._version(path, data)
        if self.checksummed_from is not None and not verified:
            verified = self._checksum(path, data, version)
        return Document(path, raw, data, version, verified)

    def validate(self, model: type[Model], body: dict, path: Path) -> Model:
        """`body` as `model`; `error` naming the file and the first field refused otherwise."""
        try:
            return model.model_validate(body)
        except ValidationError as e:
            err = e.errors()[0]
            raise self.error(f"{path}: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None

    def _version(self, path: Path, data: dict) -> int | None:
        if self.version_field is None:
            return None
        version = data.get(self.version_field)
        if not isinstance(version, int) or isinstance(version, bool):
            raise self.error(f"{path}: {self.version_field}: missing or invalid ({version!r})")
        if version not in self.readable_versions:
            newest = max(self.readable_versions)
            raise self.error(f"{path}: {self.version_field} {version}; this dlbench reads {self.version_field}s "
                             f"{_listing(self.readable_versions)}"
                             + (" (a newer dlbench wrote it: upgrade dlbench to read it)" if version > newest else ""))
        return version

    def _checksum(self, path: Path, data: dict, version: int | None) -> bool:
        """Whether the file carries a checksum, which then matches; `error` if it does not match, or
        if it is missing where every file has one. Checked whatever the version says: a damaged
        version number must not hide a damaged file."""
        stored = data.get("checksum")
        if stored is None:
            if version is None or version >= self.checksummed_from:
                since = f" of {self.version_field} {self.checksummed_from} or later" if self.checksummed_from else ""
                raise self.error(f"{path}: checksum: missing (every {self.noun}{since} has one); the file was "
                                 "edited or damaged")
            return False
        if not isinstance(stored, str) or not stored.startswith(CHECKSUM_PREFIX):
            raise self.error(f"{path}: checksum: not a {CHECKSUM_PREFIX}<hex> value ({str(stored)[:40]!r})")
        actual = checksum_of(data)
        if actual != stored:
            raise self.error(f"{path}: checksum mismatch: the file changed after it was written "
                             f"(it says {stored[:19]}..., its content hashes to {actual[:19]}...)")
        return True


def _listing(versions: Collection[int]) -> str:
    """1, 2, 3; a longer unbroken run as 1 to 14."""
    ordered = sorted(versions)
    if len(ordered) > 3 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]} to {ordered[-1]}"
    return ", ".join(map(str, ordered))
