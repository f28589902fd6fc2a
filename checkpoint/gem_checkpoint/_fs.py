"""On-disk layout, durability and the commit marker.

A directory holds `step_<N>/` (committed or being deleted) and `step_<N>.tmp/` (being
written, or left by a crash). A step is *committed* iff `step_<N>/COMMIT.json` parses and
names the step; the marker is written last, through write-temp + fsync + rename, so it is
either absent or complete. Everything here is single-process filesystem code; the
checkpointer decides which rank calls it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import zlib
from pathlib import Path
from typing import Any

log = logging.getLogger("gem_checkpoint")

MARKER = "COMMIT.json"
FORMAT = "gem_checkpoint/1"
_STEP_RE = re.compile(r"^step_(\d+)$")
_TMP_RE = re.compile(r"^step_(\d+)\.tmp$")
_CHUNK = 8 << 20


class CheckpointError(RuntimeError):
    """Base class of every error this package raises about checkpoint contents or writes."""


class CheckpointCorruptError(CheckpointError):
    """A committed checkpoint's file is missing, truncated or fails its checksum."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"corrupt checkpoint file {path}: {reason}")
        self.path = path


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step}"


def tmp_dir(root: Path, step: int) -> Path:
    return root / f"step_{step}.tmp"


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    # A rename or a new file is durable only once its directory entry is (POSIX).
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_digest(path: Path) -> tuple[int, int]:
    """Returns (size in bytes, crc32) of a file, read in 8 MiB chunks."""
    crc = 0
    size = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


def digests(folder: Path, names: list[str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name in names:
        size, crc = file_digest(folder / name)
        out[name] = {"size": size, "crc32": crc}
    return out


def _manifest_crc(manifest: dict[str, Any]) -> int:
    body = {k: v for k, v in manifest.items() if k != "manifest_crc32"}
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def write_marker(folder: Path, manifest: dict[str, Any]) -> None:
    """Atomically writes `folder/COMMIT.json`: temp file, fsync, rename, fsync dir.

    The manifest carries its own crc32 so a damaged marker is detected, not trusted.
    """
    manifest = dict(manifest, manifest_crc32=_manifest_crc(manifest))
    tmp = folder / (MARKER + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MARKER)
    fsync_dir(folder)


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The manifest of a committed step folder, or None if it is not committed."""
    try:
        with open(folder / MARKER) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None
    if not isinstance(manifest.get("files"), dict) or manifest.get("manifest_crc32") != _manifest_crc(manifest):
        return None
    return manifest


def committed_steps(root: Path) -> list[int]:
    """Steps with a valid marker whose files all exist with the recorded sizes, ascending.

    The size check is a cheap stat; checksums are verified at load time.
    """
    steps: list[int] = []
    if not root.is_dir():
        return steps
    for entry in root.iterdir():
        m = _STEP_RE.match(entry.name)
        if m is None or not entry.is_dir():
            continue
        manifest = read_marker(entry)
        if manifest is None or manifest.get("step") != int(m.group(1)):
            if (entry / MARKER).exists():
                log.warning("ignoring %s: its commit marker %s is corrupt", entry, entry / MARKER)
            continue
        ok = True
        for name, info in manifest["files"].items():
            try:
                ok = (entry / name).stat().st_size == info["size"]
            except OSError:
                ok = False
            if not ok:
                break
        if ok:
            steps.append(int(m.group(1)))
        else:
            log.warning("ignoring %s: file %s is missing or has the wrong size", entry, entry / name)
    return sorted(steps)


def verify(folder: Path, manifest: dict[str, Any], names: list[str]) -> None:
    """Raises CheckpointCorruptError naming the first bad file among `names`."""
    for name in names:
        info = manifest["files"][name]
        path = folder / name
        try:
            size, crc = file_digest(path)
        except OSError as e:
            raise CheckpointCorruptError(path, f"unreadable ({e})") from e
        if size != info["size"]:
            raise CheckpointCorruptError(
                path, f"size {size} != {info['size']} recorded at commit (truncated?)"
            )
        if crc != info["crc32"]:
            raise CheckpointCorruptError(
                path, f"crc32 {crc:#010x} != {info['crc32']:#010x} recorded at commit"
            )


def remove_step(root: Path, step: int) -> None:
    """Deletes a step: the marker first, so a half-deleted folder is never seen as committed."""
    folder = step_dir(root, step)
    try:
        (folder / MARKER).unlink()
        fsync_dir(folder)
    except FileNotFoundError:
        pass
    shutil.rmtree(folder, ignore_errors=True)


def clean_stale(root: Path, keep: set[str]) -> list[str]:
    """Removes `step_<N>.tmp/` and never-marked `step_<N>/` folders not named in `keep`.

    A `step_<N>/` whose marker exists but is damaged is left alone (and ignored): it was
    committed once, so deleting it would destroy evidence and maybe the only copy.
    """
    removed: list[str] = []
    if not root.is_dir():
        return removed
    for entry in root.iterdir():
        if entry.name in keep or not entry.is_dir():
            continue
        stale = _TMP_RE.match(entry.name) is not None
        if not stale and _STEP_RE.match(entry.name) is not None:
            stale = not (entry / MARKER).exists()
        if stale:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed
