"""Linux kernel interfaces of the sandbox harness: a read-only mount namespace, and ``prctl``.

Loaded by `sandbox_harness` (standard library only, runs inside the sandbox as root of its namespaces).
`harden_mounts` turns the mount namespace into what the program sees:

- every mount re-mounted read-only and ``nosuid`` (bind re-mounts: the host's mounts are untouched);
- fresh size-capped tmpfs on ``/tmp``, ``/var/tmp`` and ``/dev/shm``, with the work directory ``/tmp/work``;
- the Python installation made reachable for the unprivileged uid: when a directory on the way to it is not
  world-searchable (a pyenv under ``/root``, a venv in a private home), that directory is covered with an
  empty tmpfs and only the Python directories are bind-mounted back into it. This also hides whatever else
  lived there (``/root/.ssh``, tokens) from the program. A venv under ``/tmp`` is bound back (read-only) on
  top of the fresh ``/tmp`` the same way.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys
from typing import Any

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_NOATIME, _MS_NODIRATIME, _MS_BIND, _MS_REC, _MS_PRIVATE = 1024, 2048, 4096, 16384, 1 << 18
_MS_RELATIME, _MS_STRICTATIME = 1 << 21, 1 << 24
# Flags a bind re-mount must repeat (inside a user namespace the kernel refuses to clear locked ones).
_KEEP = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, "noatime": _MS_NOATIME}
_KEEP |= {"nodiratime": _MS_NODIRATIME, "relatime": _MS_RELATIME, "strictatime": _MS_STRICTATIME}
_TMPFS = {"/tmp": "size=64m,mode=1777", "/var/tmp": "size=16m,mode=1777", "/dev/shm": "size=16m,mode=1777"}
_READ_ONLY = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID
_libc = ctypes.CDLL(None, use_errno=True)


def harden_mounts(info: dict[str, Any]) -> str:
    """Set up the mount namespace (see the module docstring); returns the work directory."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE, None)  # nothing done here propagates to the host
    with open("/proc/self/mountinfo") as mountinfo:
        entries = [line.split() for line in mountinfo]
    for fields in entries:
        target = fields[4].encode().decode("unicode_escape")  # mountinfo escapes spaces as \040
        keep = sum(_KEEP.get(option, 0) for option in fields[5].split(","))
        ok = _mount(None, target, None, _READ_ONLY | keep, None) == 0
        info["readonly_mounts" if ok else "readonly_failures"] += 1
    python = _python_paths()
    info["exposed"] = _expose(python)
    for target, options in _TMPFS.items():
        # A Python installation under a tmpfs target (a venv in /tmp) is bound back read-only on top of it.
        inside = [path for path in python if path.startswith(target + "/")]
        if os.path.isdir(target) and _cover(target, inside, f"{options}") == 0:
            info["tmpfs"].append(target)
    if "/tmp" not in info["tmpfs"]:
        raise RuntimeError("could not mount a private tmpfs on /tmp for the work directory")
    os.mkdir("/tmp/work", 0o700)
    return "/tmp/work"


def _python_paths() -> list[str]:
    """Directories the program's imports read: the installation, the venv, every ``sys.path`` entry."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths |= {entry if os.path.isdir(entry) else os.path.dirname(entry) for entry in sys.path if entry}
    return sorted({os.path.realpath(path) for path in paths if os.path.isdir(path)})


def _expose(paths: list[str]) -> list[str]:
    """Make ``paths`` reachable by others when a parent directory is not world-searchable; returns those
    parent directories."""
    blocked: dict[str, list[str]] = {}
    for path in paths:
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts)):
            ancestor = "/" + "/".join(parts[:depth])
            if not os.stat(ancestor).st_mode & stat.S_IXOTH:
                blocked.setdefault(ancestor, []).append(path)
                break
    for ancestor, inside in blocked.items():
        if _cover(ancestor, inside, "size=1m,mode=755") != 0:
            raise OSError(ctypes.get_errno(), f"cannot cover {ancestor} to expose the Python installation")
    return sorted(blocked)


def _cover(directory: str, keep: list[str], options: str) -> int:
    """Mount an empty tmpfs on ``directory``, then bind the ``keep`` paths inside it back, read-only.

    Returns 0, or the errno of the tmpfs mount (nothing is bound back then)."""
    keep = [p for p in keep if not any(p.startswith(q + "/") for q in keep if q != p)]
    handles = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in keep}
    error = _mount("tmpfs", directory, "tmpfs", _MS_NOSUID | _MS_NODEV, options)
    for path, handle in handles.items():
        if error == 0:
            os.makedirs(path, mode=0o755, exist_ok=True)
            if _mount(f"/proc/self/fd/{handle}", path, None, _MS_BIND | _MS_REC, None) != 0:
                raise OSError(ctypes.get_errno(), f"cannot bind {path} back after covering {directory}")
            _mount(None, path, None, _READ_ONLY, None)
        os.close(handle)
    return error


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> int:
    """mount(2); returns 0 or the errno."""

    def encode(value: str | None) -> bytes | None:
        return None if value is None else value.encode()

    result = _libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data))
    return 0 if result == 0 else ctypes.get_errno()


def prctl(option: int, value: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")
