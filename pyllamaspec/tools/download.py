"""Fetch models from the Hugging Face Hub, each file checked against the sha256 the hub publishes.

huggingface_hub does the transfer: the standard HF cache (or --local-dir), resume of interrupted
transfers, progress bars, HF_HUB_OFFLINE / HF_TOKEN / HF_ENDPOINT. This module adds aliases for
well-known models, file selection by glob with errors that say what the repo holds, and a sha256
check of every LFS file fetched (huggingface_hub's plain HTTP path checks only the size): a file
that fails it is deleted, so nothing corrupt is left behind. A file that already lies under --local-dir is
never removed before its replacement is complete and checked: the new copy is fetched beside it (under
DIR/.cache/pyllamaspec-staging, where an interrupted transfer also resumes) and renamed over it; what is
not a regular file there is refused, not replaced.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download, try_to_load_from_cache
from huggingface_hub.utils import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    filter_repo_objects,
)

from ..errors import DownloadError, PyllamaspecError

HASH_CHUNK_BYTES = 16 * 2**20
STAGING_DIR = Path(".cache") / "pyllamaspec-staging"  # under --local-dir: new copies of files already there
MAX_LISTED_FILES = 30  # files named in a "nothing matches" error


@dataclass(frozen=True)
class HubSource:
    """What to fetch: a repo, which of its files (None: all), at which revision (None: its main branch)."""

    repo: str
    patterns: tuple[str, ...] | None
    revision: str | None
    description: str = ""


# Revisions are pinned where the exact upload is known; None follows the repo's main branch.
ALIASES: dict[str, HubSource] = {
    "qwen3.8-27b-dflash2": HubSource(
        "z-lab/Qwen3.8-27B-DFlash2", ("*.json", "*.safetensors"), "50307d4c4cde6860d4eee73e2547cd786fe8e8a4",
        "DFlash2 drafter for Qwen3.8-27B, HF checkpoint (convert to GGUF)",
    ),
    "qwen3.8-27b-dflash2-gguf": HubSource(
        "incoai/Qwen3.8-27B-DFlash2-GGUF", ("*.gguf",), None,
        "DFlash2 drafter for Qwen3.8-27B, GGUF (every quant: name one as FILE_PATTERN to fetch only it)",
    ),
    "qwen3.6-27b-dflash": HubSource(
        "z-lab/Qwen3.6-27B-DFlash", ("*.json", "*.safetensors"), None,
        "DFlash drafter for Qwen3.6-27B, HF checkpoint (convert to GGUF)",
    ),
    "qwen3.6-35b-a3b-dflash": HubSource(
        "z-lab/Qwen3.6-35B-A3B-DFlash", ("*.json", "*.safetensors"), None,
        "DFlash drafter for Qwen3.6-35B-A3B, HF checkpoint (convert to GGUF)",
    ),
    "qwen3.6-27b-dflash-gguf": HubSource(
        "Alittlehammmer/Qwen3.6-27B-DFlash-GGUF-llama.cpp", ("*-Q8_0.gguf",), None,
        "DFlash drafter for Qwen3.6-27B, community GGUF conversion, Q8_0",
    ),
    "qwen3.6-35b-a3b-dflash-gguf": HubSource(
        "Alittlehammmer/Qwen3.6-35B-A3B-DFlash-GGUF-llama.cpp", ("*-Q6_K.gguf",), None,
        "DFlash drafter for Qwen3.6-35B-A3B, community GGUF conversion, Q6_K",
    ),
}


def resolve_source(repo_or_alias: str) -> HubSource:
    """An alias's source, or a repo id taken as is (all files, main branch)."""
    if repo_or_alias in ALIASES:
        return ALIASES[repo_or_alias]
    if repo_or_alias.count("/") == 1 and all(repo_or_alias.split("/")):
        return HubSource(repo_or_alias, None, None)
    raise DownloadError(
        f"{repo_or_alias!r} is neither a hub repo id (owner/name) nor a known alias; "
        f"aliases: {', '.join(ALIASES)}"
    )


def download(
    repo_or_alias: str,
    patterns: Sequence[str] | None = None,
    revision: str | None = None,
    local_dir: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """Fetch the files of a repo (or alias) that match ``patterns``; return their local paths.

    ``patterns`` are file names or globs (``*`` also crosses folders); None takes the alias's, else
    every file. ``revision`` (branch, tag or commit) overrides the alias's. Files go to the HF cache,
    or under ``local_dir``. With HF_HUB_OFFLINE set, only the cache is looked at. Raises DownloadError.
    """
    source = resolve_source(repo_or_alias)
    selected = tuple(patterns) if patterns else source.patterns
    revision = revision or source.revision
    destination = Path(local_dir) if local_dir is not None else None
    if constants.HF_HUB_OFFLINE:
        return _from_cache(source.repo, selected, revision, destination)
    return _from_hub(source.repo, selected, revision, destination)


def _from_hub(repo: str, patterns: tuple[str, ...] | None, revision: str | None, local_dir: Path | None) -> list[Path]:
    with _hub_errors(repo, revision):
        info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    siblings = {sibling.rfilename: sibling for sibling in info.siblings or []}
    paths = []
    advice = "Pass one of these names (or a glob) as FILE_PATTERN."
    for name in _select(list(siblings), patterns, where=f"{repo} on the hub", advice=advice):
        _check_file_name(repo, name)
        lfs = siblings[name].lfs
        if local_dir is not None and os.path.lexists(local_dir / name):
            paths.append(_replace_in_local_dir(repo, name, revision, local_dir, siblings[name]))
            continue
        before = _identity(_present_copy(repo, name, revision, local_dir))
        with _hub_errors(repo, revision, name, local_dir):
            path = Path(hf_hub_download(repo, name, revision=revision, local_dir=local_dir))
        # a copy that was already there was checked when it was fetched: hashing a large GGUF on every
        # call would cost minutes
        if lfs is not None and _identity(path) != before:
            _verify_sha256(path, lfs.sha256, f"{repo}/{name}", in_cache=local_dir is None)
        paths.append(path)
    return paths


def _check_file_name(repo: str, name: str) -> None:
    """A repo file name must stay inside the folder it is fetched into."""
    pure = PurePosixPath(name)
    if not name or pure.is_absolute() or ".." in pure.parts or "\\" in name or "\0" in name:
        raise DownloadError(
            f"{repo} lists a file named {name!r}, which would be written outside the download folder; "
            "refusing to fetch it"
        )


def _replace_in_local_dir(repo: str, name: str, revision: str | None, local_dir: Path, sibling) -> Path:
    """Fetch `name` over a copy already under local_dir without ever removing that copy first: when the copy is
    not the hub's version, the new one is fetched into a staging folder, checked, then renamed over it."""
    dest = local_dir / name
    try:
        mode = os.lstat(dest).st_mode
    except OSError as err:
        raise DownloadError(f"cannot look at {dest}: {err.strerror or err}") from None
    if not stat.S_ISREG(mode):
        what = ("a directory" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode)
                else "not a regular file")
        raise DownloadError(f"{dest} is {what}; refusing to replace it with {repo}/{name}. Move it away or "
                            "choose another --local-dir.")
    lfs = sibling.lfs
    if _local_copy_is_current(local_dir, name, lfs.sha256 if lfs is not None else getattr(sibling, "blob_id", None)):
        with _hub_errors(repo, revision, name, local_dir):  # huggingface_hub only refreshes its bookkeeping
            return Path(hf_hub_download(repo, name, revision=revision, local_dir=local_dir))
    staging = local_dir / STAGING_DIR
    with _hub_errors(repo, revision, name, local_dir):
        staged = Path(hf_hub_download(repo, name, revision=revision, local_dir=staging))
    if lfs is not None:
        _verify_sha256(staged, lfs.sha256, f"{repo}/{name}", in_cache=False)
    try:
        os.replace(staged, dest)
    except OSError as err:
        raise DownloadError(f"cannot put the new {repo}/{name} in place of {dest}: {err.strerror or err} "
                            f"(the old file is untouched; the new one is {staged})") from None
    _move_download_metadata(staging, local_dir, name)
    return dest.resolve()


def _local_copy_is_current(local_dir: Path, name: str, etag: str | None) -> bool:
    """Whether huggingface_hub's own record says the copy under local_dir is the hub's version `etag`."""
    if not etag:
        return False
    try:
        from huggingface_hub._local_folder import read_download_metadata

        metadata = read_download_metadata(local_dir, name)
    except Exception:  # another huggingface_hub layout: fetch a new copy (beside the old one) instead
        return False
    return metadata is not None and metadata.etag == etag


def _move_download_metadata(staging: Path, local_dir: Path, name: str) -> None:
    """huggingface_hub's record of the staged copy follows it, so the next call sees the copy as current."""
    try:
        from huggingface_hub._local_folder import get_local_download_paths

        src = get_local_download_paths(staging, name).metadata_path
        dst = get_local_download_paths(local_dir, name).metadata_path
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
    except Exception:
        pass  # without the record, the next call fetches a fresh copy (beside this one) and renames it over


def _from_cache(
    repo: str, patterns: tuple[str, ...] | None, revision: str | None, local_dir: Path | None
) -> list[Path]:
    with _hub_errors(repo, revision):
        folder = Path(
            snapshot_download(
                repo, revision=revision, local_dir=local_dir, allow_patterns=list(patterns) if patterns else None,
                local_files_only=True,
            )
        )
    # under a local_dir, .cache/ holds huggingface_hub's bookkeeping, not repo files
    names = [
        path.relative_to(folder).as_posix()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.relative_to(folder).parts[0] != ".cache"
    ]
    advice = "HF_HUB_OFFLINE is set: unset it to fetch the file from the hub."
    return [folder / name for name in _select(names, patterns, where=f"the cached copy of {repo}", advice=advice)]


def _select(names: list[str], patterns: tuple[str, ...] | None, *, where: str, advice: str) -> list[str]:
    """The names matching any pattern, in listing order; every pattern must match something."""
    if patterns is None:
        if not names:
            raise DownloadError(f"{where} has no files.")
        return names
    unmatched = [p for p in patterns if not list(filter_repo_objects(names, allow_patterns=[p]))]
    if unmatched:
        listed = ", ".join(names[:MAX_LISTED_FILES]) + (", ..." if len(names) > MAX_LISTED_FILES else "")
        raise DownloadError(
            f"no file in {where} matches {', '.join(unmatched)}. It has: {listed or 'no files'}. {advice}"
        )
    return list(filter_repo_objects(names, allow_patterns=list(patterns)))


def _present_copy(repo: str, name: str, revision: str | None, local_dir: Path | None) -> Path | None:
    """Where the file already lies, if it does, before huggingface_hub decides whether to fetch it."""
    if local_dir is not None:
        path = local_dir / name
        return path if path.is_file() else None
    cached = try_to_load_from_cache(repo, name, revision=revision)
    return Path(cached) if isinstance(cached, str) else None


def _identity(path: Path | None) -> tuple[int, ...] | None:
    """Which file (through the cache's symlink) with which size and mtime: a fresh download changes it."""
    if path is None or not path.exists():
        return None
    stat = path.stat()
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _verify_sha256(path: Path, expected: str, label: str, *, in_cache: bool) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    actual = digest.hexdigest()
    if actual == expected.lower():
        return
    # in the cache, `path` is a snapshot symlink to the blob that holds the bytes: remove both
    blob = Path(os.path.realpath(path))
    path.unlink()
    if in_cache:
        blob.unlink(missing_ok=True)
    raise DownloadError(
        f"{label}: sha256 mismatch, the hub publishes {expected} but the downloaded file has {actual}. "
        "The file was deleted; download it again (if it fails again, HF_ENDPOINT or a proxy serves bad data)."
    )


def _is_network_error(err: BaseException) -> bool:
    # The hub client's transport errors come from whichever HTTP library that huggingface_hub version uses
    # (requests, httpx, httpx2, urllib3): a class of one of them, or the builtin connection/timeout errors.
    for cls in type(err).__mro__:
        if cls.__module__.split(".")[0] in ("requests", "httpx", "httpx2", "httpcore", "urllib3"):
            return True
    return isinstance(err, (ConnectionError, TimeoutError))


@contextmanager
def _hub_errors(repo: str, revision: str | None, filename: str | None = None,
                local_dir: Path | None = None) -> Iterator[None]:
    """Turn huggingface_hub's failures into DownloadError saying what happened and what to do."""
    what = f"{repo}/{filename}" if filename else repo
    at = f" at revision {revision}" if revision else ""
    where = str(local_dir) if local_dir is not None else f"the Hugging Face cache ({constants.HF_HUB_CACHE})"
    try:
        try:
            from huggingface_hub.errors import HFValidationError, OfflineModeIsEnabled
        except ImportError:  # older huggingface_hub
            from huggingface_hub.utils import HFValidationError, OfflineModeIsEnabled
        try:
            yield
        except OfflineModeIsEnabled as err:
            raise DownloadError(
                f"{what}{at} is not in the local cache and HF_HUB_OFFLINE is set, so the hub is not asked. "
                "Unset HF_HUB_OFFLINE to fetch it."
            ) from err
        except HFValidationError as err:
            raise DownloadError(f"{repo!r} is not a valid hub repo id (owner/name): {err}") from err
    except GatedRepoError as err:
        raise DownloadError(
            f"{repo} is gated: accept its terms at {constants.ENDPOINT}/{repo}, then set HF_TOKEN to a token "
            "of that account."
        ) from err
    except RepositoryNotFoundError as err:
        raise DownloadError(
            f"repository {repo} was not found on {constants.ENDPOINT} (if it is private, set HF_TOKEN). "
            "Check the name; `pyllamaspec download --list-aliases` lists known models."
        ) from err
    except RevisionNotFoundError as err:
        raise DownloadError(f"{repo} has no revision {revision!r}: check the branch, tag or commit.") from err
    except LocalEntryNotFoundError as err:  # before EntryNotFoundError: it derives from it
        why = ("HF_HUB_OFFLINE is set, so the hub is not asked: unset it, or download it once with network access"
               if constants.HF_HUB_OFFLINE else
               f"the hub ({constants.ENDPOINT}) cannot be reached: check the network and try again")
        raise DownloadError(f"{what}{at} is not in the local cache, and {why}.") from err
    except EntryNotFoundError as err:
        raise DownloadError(f"{what} does not exist{at}. List the repo's files on the hub and pick one.") from err
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else "an error"
        raise DownloadError(f"the hub answered {status} for {what}{at}; try again later. ({err})") from err
    except PyllamaspecError:
        raise
    except Exception as err:
        if _is_network_error(err):
            raise DownloadError(
                f"fetching {what}{at} from {constants.ENDPOINT} failed, the network or the hub did not answer: "
                f"{type(err).__name__}: {err}. Check the network (or set HF_HUB_OFFLINE=1 to use only cached "
                "files) and try again."
            ) from err
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DownloadError(
                f"fetching {what}{at}: the disk is full (no space left for {where}). Free some space and run "
                "the download again: it resumes where it stopped."
            ) from err
        if isinstance(err, OSError):
            raise DownloadError(
                f"fetching {what}{at}: cannot write into {where}: {err.strerror or err}"
                + (f" ({err.filename})" if err.filename else "")
            ) from err
        raise DownloadError(f"fetching {what}{at} from {constants.ENDPOINT} failed: {type(err).__name__}: {err}") \
            from err
