"""The self-checking file a :class:`~marsys_mem.retrieval.index.FaissIndex` is saved in.

Format (version 1)::

    b"MARSYSVI" | u32 header length | u32 CRC-32 of the header | header (JSON, UTF-8) | payload

The header holds the format name and version, the index's fields (``dim``, ``kind``,
``count``, ...), the caller's ``meta`` (e.g. the embedder name), the byte ranges of the
payload's sections (the serialised faiss index, the int64 labels, the ids as a JSON list)
and the SHA-256 of the payload. Files are written atomically (temp file, fsync, rename,
fsync of the folder) so a crash leaves the old file or the new one, never a mix; a file
that is truncated, padded, corrupt, of another version or stale (another ``dim`` or
``meta``) is refused with :class:`~marsys_mem.exceptions.IndexCorruptError`. No pickle.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from marsys_mem.exceptions import IndexCorruptError, StoreError

__all__ = ["FORMAT_VERSION", "read_index_file", "read_index_header", "write_index_file"]

FORMAT_VERSION = 1
"""Version of the file written by :meth:`FaissIndex.save`."""

_MAGIC = b"MARSYSVI"
_PREFIX = struct.Struct("<II")  # header length, CRC-32 of the header
_FORMAT_NAME = "marsys-mem/faiss-index"


def write_index_file(
    path: str | os.PathLike[str],
    fields: Mapping[str, Any],
    meta: Mapping[str, Any],
    sections: Sequence[tuple[str, memoryview]],
) -> None:
    """Write ``fields``, ``meta`` and the payload ``sections`` to ``path``, atomically.

    Raises:
        StoreError: the file cannot be written (the old file, if any, is untouched).
    """
    ranges: dict[str, list[int]] = {}
    offset = 0
    digest = hashlib.sha256()
    for name, data in sections:
        ranges[name] = [offset, data.nbytes]
        offset += data.nbytes
        digest.update(data)
    header = {
        "format": _FORMAT_NAME,
        "version": FORMAT_VERSION,
        **fields,
        "meta": dict(meta),
        "sections": ranges,
        "payload_size": offset,
        "sha256": digest.hexdigest(),
    }
    header_bytes = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(_MAGIC)
                fh.write(_PREFIX.pack(len(header_bytes), zlib.crc32(header_bytes)))
                fh.write(header_bytes)
                for _name, data in sections:
                    fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp_name, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise
        _fsync_dir(target.parent)
    except OSError as exc:
        raise StoreError(f"cannot save the index to {str(target)!r}: {exc}") from exc


def read_index_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON header of a saved index (reads only the header; the payload is unchecked).

    Raises:
        IndexCorruptError: the file is missing or its header is unreadable.
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_MAGIC) + _PREFIX.size)
            header, _ = _parse_header(path, head, fh.read)
    except OSError as exc:
        raise IndexCorruptError(f"cannot read the index file {str(path)!r}: {exc}") from exc
    return header


def read_index_file(
    path: str | os.PathLike[str],
    *,
    expected_dim: int | None = None,
    expected_meta: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, memoryview]]:
    """Read and check a saved index: its header and its payload sections by name.

    Args:
        path: the file.
        expected_dim: if given, the saved ``dim`` must equal it.
        expected_meta: if given, every key in it must be in the saved meta with an equal
            value (other saved keys are ignored).

    Raises:
        IndexCorruptError: the file is missing, not an index file, truncated, fails its
            checksum, or is stale (another ``dim`` or ``meta``).
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise IndexCorruptError(f"cannot read the index file {str(path)!r}: {exc}") from exc
    pos = len(_MAGIC) + _PREFIX.size

    def take(n: int) -> bytes:
        nonlocal pos
        chunk = data[pos : pos + n]
        pos += len(chunk)
        return chunk

    header, payload_start = _parse_header(path, data[:pos], take)
    where = f"index file {str(path)!r}"
    if expected_dim is not None and header["dim"] != expected_dim:
        raise IndexCorruptError(
            f"stale {where}: dimension {header['dim']}, expected {expected_dim}"
        )
    if expected_meta is not None:
        saved = header["meta"]
        diffs = [
            f"{key}={saved.get(key)!r} (expected {value!r})"
            for key, value in expected_meta.items()
            if key not in saved or saved[key] != value
        ]
        if diffs:
            raise IndexCorruptError(f"stale {where}: saved with {', '.join(diffs)}")
    payload = memoryview(data)[payload_start:]
    if len(payload) != header["payload_size"]:
        raise IndexCorruptError(
            f"truncated or padded {where}: payload of {len(payload)} bytes, "
            f"expected {header['payload_size']}"
        )
    if hashlib.sha256(payload).hexdigest() != header["sha256"]:
        raise IndexCorruptError(f"corrupt {where}: checksum mismatch")
    sections: dict[str, memoryview] = {}
    for name, span in header["sections"].items():
        if not (
            isinstance(span, list)
            and len(span) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in span)
        ):
            raise IndexCorruptError(f"corrupt {where}: section {name!r} is malformed")
        start, size = span
        if not (0 <= start and 0 <= size and start + size <= len(payload)):
            raise IndexCorruptError(f"corrupt {where}: section {name!r} out of bounds")
        sections[name] = payload[start : start + size]
    return header, sections


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_HEADER_TYPES: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "version": int,
    "dim": int,
    "kind": str,
    "requested_kind": str,
    "count": int,
    "next_label": int,
    "hnsw_threshold": int,
    "hnsw_m": int,
    "ef_search": int,
    "meta": dict,
    "sections": dict,
    "payload_size": int,
    "sha256": str,
}


def _parse_header(
    path: str | os.PathLike[str], head: bytes, read: Any
) -> tuple[dict[str, Any], int]:
    """Parse magic, prefix and header; ``read(n)`` returns the next ``n`` bytes."""
    where = f"index file {str(path)!r}"
    if len(head) < len(_MAGIC) + _PREFIX.size or not head.startswith(_MAGIC):
        raise IndexCorruptError(f"{where} is not a marsys-mem vector index (bad magic bytes)")
    size, crc = _PREFIX.unpack_from(head, len(_MAGIC))
    header_bytes = read(size)
    if len(header_bytes) != size:
        raise IndexCorruptError(f"truncated {where}: header cut short")
    if zlib.crc32(header_bytes) != crc:
        raise IndexCorruptError(f"corrupt {where}: header checksum mismatch")
    try:
        header = json.loads(header_bytes)
    except ValueError as exc:
        raise IndexCorruptError(f"corrupt {where}: header is not JSON") from exc
    if not isinstance(header, dict) or header.get("format") != _FORMAT_NAME:
        raise IndexCorruptError(f"{where} is not a marsys-mem vector index")
    if header.get("version") != FORMAT_VERSION:
        raise IndexCorruptError(
            f"{where} has format version {header.get('version')!r}; this marsys-mem reads "
            f"version {FORMAT_VERSION}: rebuild the index"
        )
    for key, typ in _HEADER_TYPES.items():
        if not isinstance(header.get(key), typ) or isinstance(header.get(key), bool):
            raise IndexCorruptError(f"corrupt {where}: header field {key!r} is missing or invalid")
    if header["kind"] not in ("flat", "hnsw") or header["requested_kind"] not in (
        "flat",
        "ivf",
        "hnsw",
        "auto",
    ):
        raise IndexCorruptError(f"corrupt {where}: unknown kind {header['kind']!r}")
    return header, len(_MAGIC) + _PREFIX.size + size
