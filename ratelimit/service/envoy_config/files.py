"""envoyproxy/ratelimit's configuration files, found and loaded as it finds and loads them.

Each file is read and decoded (:func:`~ratelimit.service.envoy_config.yaml_go.root_of`),
then the domains are loaded in file order
(:class:`~ratelimit.service.envoy_config.descriptors.EnvoyConfig`), so that of two files
holding the same domain or composite key the second is named.

**The service** (:func:`load_runtime`, :func:`runtime_files`) reads what its file provider
has its runtime loader (``github.com/lyft/goruntime`` v0.3.0, ``loader.New2``) read:

- ``RUNTIME_WATCH_ROOT=true`` (its default): every file under
  ``RUNTIME_ROOT/RUNTIME_SUBDIRECTORY``, each named by its **key**, its path below that
  directory with ``/`` made ``.`` (``config/edge.yaml`` is ``config.edge.yaml``, extension
  kept); the files whose key starts with ``RUNTIME_APPDIRECTORY.`` are loaded, so that
  both ``config/edge.yaml`` and a ``config.yaml`` beside the ``config`` directory are.
  With no ``RUNTIME_SUBDIRECTORY`` (its default) it reads nothing at all: the
  configuration is empty.
- ``RUNTIME_WATCH_ROOT=false``: every file under
  ``RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY``, its key its path below
  that directory (``edge.yaml``, ``team.edge.yaml``); nothing without an
  ``RUNTIME_APPDIRECTORY``.

Errors name a file by its key, as the service does. The walk is Go's ``filepath.Walk``:
depth first in name order; a symbolic link is read as a file (one to a directory cannot be
read); with ``RUNTIME_IGNOREDOTFILES`` dot files and dot directories are skipped (a
Kubernetes ConfigMap's ``..2026_...`` directory holds a second copy of every file). What
cannot be read (a dangling link such as Emacs's ``.#edge.yaml``, a file without
permission, a missing directory) is skipped with a warning on the ``ratelimit.service``
logger, as its loader logs it; a missing directory is an empty configuration. Two files of
one key (``a/b.yaml`` and ``a.b.yaml``): the later in the walk is read. Go loads the files
in the order of a Go map, which changes from run to run; here they load in walk order.

What differs, and is the caller's: Go's service watches one directory and fails at start
when it is missing. With ``RUNTIME_WATCH_ROOT=true`` it is the parent of ``RUNTIME_ROOT``,
and only the ``RUNTIME_ROOT`` link itself being replaced reloads; without, it is the
application directory, whose own entries (not its subdirectories') reload.
:func:`runtime_files` lists every file a load reads, so that a caller can watch exactly
those.

**The check command** (:func:`load_directory`, :func:`check_directory`) reads one
directory and every directory in it, each file named by its path.

Example::

    config = load_runtime("/srv/runtime_data/current", "ratelimit", "config", True, False, False)
    matched = config.limit_of("edge", [("remote_address", "10.0.0.1")])
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ratelimit.service.envoy_config.descriptors import EnvoyConfig
from ratelimit.service.envoy_config.yaml_go import (
    ConfigFileError,
    YamlRoot,
    root_of,
    text_of,
    too_deep,
)

logger = logging.getLogger("ratelimit.service")


@dataclass(frozen=True)
class RuntimeFile:
    """One file its runtime loader reads."""

    key: str
    """Its name in the service's errors: its path below the directory walked, ``/`` made
    ``.`` (``config.edge.yaml``)."""
    path: str
    """Where it is read."""


def runtime_files(
    root: str,
    subdirectory: str,
    appdirectory: str,
    watch_root: bool,
    ignore_dotfiles: bool,
) -> list[RuntimeFile]:
    """The files :func:`load_runtime` reads with these settings (``RUNTIME_ROOT``,
    ``RUNTIME_SUBDIRECTORY``, ``RUNTIME_APPDIRECTORY``, ``RUNTIME_WATCH_ROOT``,
    ``RUNTIME_IGNOREDOTFILES``), in the order it loads them; what cannot be walked is left
    out, silently."""
    return _runtime(root, subdirectory, appdirectory, watch_root, ignore_dotfiles, [])


def load_runtime(
    root: str,
    subdirectory: str,
    appdirectory: str,
    watch_root: bool,
    merge_domains: bool,
    ignore_dotfiles: bool,
    algorithm: str | None = None,
) -> EnvoyConfig:
    """The domains of the files its service reads with these settings (see the module);
    :class:`ConfigFileError` (``"<key>: <message>"``) for the first file its loader refuses.
    A file or directory that cannot be read is skipped with a warning. ``algorithm``: the
    limits are for our algorithm (:mod:`~ratelimit.service.envoy_config.ours`)."""
    problems: list[str] = []
    files = _runtime(root, subdirectory, appdirectory, watch_root, ignore_dotfiles, problems)
    for problem in problems:
        logger.warning("%s", problem)
    roots: list[tuple[str, YamlRoot]] = []
    for file in files:
        try:
            data = Path(file.path).read_bytes()
        except OSError as exc:
            logger.warning("runtime: error reading %s: %s", file.path, _go_error(file.path, exc))
            continue
        roots.append((file.key, root_of(file.key, text_of(file.key, data), bool(algorithm))))
    return _configured(roots, merge_domains, algorithm)


def _runtime(
    root: str,
    subdirectory: str,
    appdirectory: str,
    watch_root: bool,
    ignore_dotfiles: bool,
    problems: list[str],
) -> list[RuntimeFile]:
    """``New2`` and the provider's choice of keys; the walk's problems added to
    ``problems``."""
    if watch_root:
        watched, below, prefix = root, subdirectory, f"{appdirectory}."
    else:
        watched, below, prefix = _go_join(root, subdirectory), appdirectory, ""
    if not watched or not below:
        problems.append("no runtime configuration. using nil loader.")
        return []
    found: dict[str, str] = {}
    for key, path in _walk(_go_join(watched, below), ignore_dotfiles, problems):
        found.pop(key, None)  # the later file of a key replaces the earlier
        found[key] = path
    return [RuntimeFile(key, path) for key, path in found.items() if key.startswith(prefix)]


def _go_join(*parts: str) -> str:
    """Go's ``filepath.Join``: the parts that are not empty, joined and cleaned."""
    joined = "/".join(part for part in parts if part)
    return os.path.normpath(joined) if joined else ""


def _walk(top: str, ignore_dotfiles: bool, problems: list[str]) -> list[tuple[str, str]]:
    """``filepath.Walk`` with goruntime's ``walkDirectoryCallback``: each file's key and
    path, depth first in name order; a link is a file; what cannot be listed is a problem."""
    found: list[tuple[str, str]] = []

    def walk(path: str, key: str, mode: int) -> None:
        name = os.path.basename(path)
        if not stat.S_ISDIR(mode):
            if not (ignore_dotfiles and name.startswith(".")):
                found.append((key or ".", path))
            return
        try:
            names = sorted(os.listdir(path))
        except OSError as exc:
            problems.append(f"runtime: error processing {path}: {_go_error(path, exc, 'open')}")
            return
        if ignore_dotfiles and name.startswith("."):
            return
        for child in names:
            child_path = os.path.join(path, child)
            try:
                child_mode = os.lstat(child_path).st_mode
            except OSError as exc:
                error = _go_error(child_path, exc, "lstat")
                problems.append(f"runtime: error processing {child_path}: {error}")
                continue
            walk(child_path, f"{key}.{child}" if key else child, child_mode)

    try:
        mode = os.lstat(top).st_mode
    except OSError as exc:
        problems.append(f"runtime: error processing {top}: {_go_error(top, exc, 'lstat')}")
        return found
    walk(top, "", mode)
    return found


def _go_error(path: str, exc: OSError, operation: str = "open") -> str:
    """An ``OSError`` as Go words it: ``open /x: permission denied``, ``read /x: is a
    directory``."""
    reason = exc.strerror or str(exc)
    if isinstance(exc, IsADirectoryError):
        operation = "read"
    return f"{operation} {path}: {reason[:1].lower()}{reason[1:]}"


def _configured(
    roots: list[tuple[str, YamlRoot]], merge_domains: bool, algorithm: str | None
) -> EnvoyConfig:
    """``NewRateLimitConfigImpl``: the files' domains, loaded in order."""
    config = EnvoyConfig(merge_domains, algorithm)
    for name, root in roots:
        try:
            config.load(name, root)
        except RecursionError:
            raise too_deep(name) from None
    return config


def load_directory(
    directory: str | os.PathLike[str],
    merge_domains: bool = False,
    ignore_dotfiles: bool = False,
    algorithm: str | None = None,
) -> EnvoyConfig:
    """The domains of every file in ``directory`` and the directories in it, each named by
    its path; :class:`ConfigFileError` (``"<file>: <message>"``) for the first file its
    loader refuses, ``OSError`` for a directory or file that cannot be read. ``algorithm``:
    the limits are for our algorithm (:mod:`~ratelimit.service.envoy_config.ours`), and may
    be written as ours allow."""
    roots = []
    for path in _files(os.fspath(directory), ignore_dotfiles):
        text = text_of(path, Path(path).read_bytes())
        roots.append((path, root_of(path, text, bool(algorithm))))
    return _configured(roots, merge_domains, algorithm)


def _files(directory: str, ignore_dotfiles: bool) -> list[str]:
    """The files under ``directory``, depth first in name order."""
    found: list[str] = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if ignore_dotfiles and entry.name.startswith("."):
            continue
        path = os.path.join(directory, entry.name)
        if entry.is_dir(follow_symlinks=False):
            found += _files(path, ignore_dotfiles)
        elif not entry.is_dir():  # a link to a directory is not followed
            found.append(path)
    return found


def check_directory(
    directory: str | os.PathLike[str], merge_domains: bool = False, algorithm: str | None = None
) -> tuple[bool, list[str]]:
    """``config_check_cmd``: whether ``directory`` loads, and the lines to print (its own:
    ``checking rate limit configs...``, then ``all rate limit configs ok`` or ``error
    loading rate limit configs: <file>: <message>``)."""
    lines = ["checking rate limit configs...", f"loading config directory: {directory}"]
    try:
        load_directory(directory, merge_domains, algorithm=algorithm)
    except ConfigFileError as exc:
        return False, [*lines, f"error loading rate limit configs: {exc}"]
    except OSError as exc:
        return False, [*lines, f"error opening directory {directory}: {exc.strerror or exc}"]
    return True, [*lines, "all rate limit configs ok"]
