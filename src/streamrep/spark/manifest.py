"""A change set's manifest: the size and SHA-256 of every file ``spark compress`` wrote.

``streamrep spark compress`` writes ``MANIFEST.json`` last, over every other file
of its output. ``streamrep state apply-compression`` checks every file against it
before it writes anything: a file changed, cut short, missing or added makes the
change set refuse itself with :class:`~streamrep.errors.ChangeSetError`, so a
damaged change set never gets half applied.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from streamrep.errors import ChangeSetError

__all__ = ["MANIFEST_NAME", "MANIFEST_VERSION", "write_manifest", "check_manifest"]

MANIFEST_NAME = "MANIFEST.json"
MANIFEST_VERSION = 1

_CHUNK = 1 << 20


def _filesystem(output: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    if "://" in output:
        found: tuple[Any, str] = pafs.FileSystem.from_uri(output)
        return found
    return pafs.LocalFileSystem(), os.path.abspath(output)


def _files(fs: Any, root: str) -> dict[str, int]:
    """Every file under *root* but the manifest: relative path -> size."""
    import pyarrow.fs as pafs

    found = {}
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if info.type != pafs.FileType.File:
            continue
        relative = info.path[len(root):].lstrip("/")
        if relative != MANIFEST_NAME:
            found[relative] = int(info.size)
    return found


def _sha256(fs: Any, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open_input_stream(path) as stream:
        while True:
            chunk = stream.read(_CHUNK)
            if not chunk:
                break
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(output: str) -> int:
    """Write ``MANIFEST.json`` over every file under *output*; returns how many."""
    fs, root = _filesystem(output)
    entries = {relative: {"bytes": size, "sha256": _sha256(fs, f"{root}/{relative}")}
               for relative, size in sorted(_files(fs, root).items())}
    text = json.dumps({"version": MANIFEST_VERSION, "files": entries}, indent=1, sort_keys=True)
    with fs.open_output_stream(f"{root}/{MANIFEST_NAME}") as stream:
        stream.write(text.encode("utf-8"))
    return len(entries)


def _read_manifest(fs: Any, root: str, output: str) -> dict[str, dict[str, Any]]:
    import pyarrow.fs as pafs

    path = f"{root}/{MANIFEST_NAME}"
    if fs.get_file_info(path).type != pafs.FileType.File:
        raise ChangeSetError(f"change set {output} has no {MANIFEST_NAME}: it was not written "
                             "completely by `streamrep spark compress`")
    try:
        with fs.open_input_stream(path) as stream:
            manifest = json.loads(stream.read().decode("utf-8"))
        files = manifest["files"]
        if manifest.get("version") != MANIFEST_VERSION or not isinstance(files, dict):
            raise ValueError(f"version {manifest.get('version')!r}")
        return {str(k): {"bytes": int(v["bytes"]), "sha256": str(v["sha256"])}
                for k, v in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ChangeSetError(f"change set {output} has an unreadable {MANIFEST_NAME} "
                             f"({exc})") from None


def check_manifest(output: str) -> int:
    """Check every file under *output* against its manifest, in full.

    Returns how many files were checked; raises ChangeSetError naming the first
    file that is missing, added, of another size or with another digest.
    """
    fs, root = _filesystem(output)
    listed = _read_manifest(fs, root, output)
    present = _files(fs, root)
    for relative in sorted(listed):
        if relative not in present:
            raise ChangeSetError(f"change set {output} lacks {relative}, which its "
                                 f"{MANIFEST_NAME} lists")
    for relative in sorted(present):
        if relative not in listed:
            raise ChangeSetError(f"change set {output} holds {relative}, which its "
                                 f"{MANIFEST_NAME} does not list")
    for relative, entry in sorted(listed.items()):
        size = present[relative]
        if size != entry["bytes"]:
            raise ChangeSetError(f"change set {output}: {relative} has {size} bytes, its "
                                 f"{MANIFEST_NAME} says {entry['bytes']} (truncated or changed)")
        if _sha256(fs, f"{root}/{relative}") != entry["sha256"]:
            raise ChangeSetError(f"change set {output}: {relative} does not match the SHA-256 "
                                 f"in its {MANIFEST_NAME} (changed since it was written)")
    return len(listed)
