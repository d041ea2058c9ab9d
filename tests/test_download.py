"""pyllamaspec.tools.download, `pyllamaspec download` and hub model arguments, against the real huggingface_hub
client and a local hub (tests/hfserver.py)."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from huggingface_hub import constants as hub_constants

from hfserver import COMMIT, FakeHub, HubFile
from pyllamaspec.cli import download as download_cmd
from pyllamaspec.cli.app import run_command
from pyllamaspec.tools import download as dl
from pyllamaspec.errors import DownloadError

REPO = "org/model"
GGUF_NAME = "model-Q8_0.gguf"
# Small transfer chunks, so a transfer cut after CUT_AT bytes has written whole chunks to resume from
# (huggingface_hub buffers DOWNLOAD_CHUNK_SIZE, 10 MiB, before writing).
TEST_CHUNK_BYTES = 16 * 1024
CUT_AT = 5 * TEST_CHUNK_BYTES


def payload(n_bytes: int, seed: int = 0) -> bytes:
    """Deterministic bytes that differ at every offset, so a misplaced resume cannot go unnoticed."""
    blocks = (hashlib.sha256(f"{seed}:{i}".encode()).digest() for i in range(n_bytes // 32 + 1))
    return b"".join(blocks)[:n_bytes]


@dataclass
class HubSession:
    hub: FakeHub
    hf_home: Path
    monkeypatch: pytest.MonkeyPatch

    def set_offline(self) -> None:
        self.monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        _reload_hub_constants(self.monkeypatch)

    def cached_files(self) -> list[Path]:
        """Every regular file the HF cache holds for REPO (blobs, and snapshot entries that are not links)."""
        repo_dir = self.hf_home / "hub" / ("models--" + REPO.replace("/", "--"))
        return [p for p in repo_dir.rglob("*") if p.is_file() and not p.is_symlink() and "refs" not in p.parts]


def _reload_hub_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    # huggingface_hub reads HF_ENDPOINT, HF_HOME, HF_HUB_OFFLINE... into its constants module at import
    importlib.reload(hub_constants)
    monkeypatch.setattr(hub_constants, "DOWNLOAD_CHUNK_SIZE", TEST_CHUNK_BYTES)


@pytest.fixture
def session(tmp_path: Path) -> Iterator[HubSession]:
    hub = FakeHub()
    with pytest.MonkeyPatch.context() as mp, hub.running():
        for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
                     "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT", "HUGGINGFACE_CO_STAGING"):
            mp.delenv(name, raising=False)
        mp.setenv("HF_ENDPOINT", hub.url)
        mp.setenv("HF_HOME", str(tmp_path / "hf"))
        mp.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        mp.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        _reload_hub_constants(mp)
        yield HubSession(hub, tmp_path / "hf", mp)
    importlib.reload(hub_constants)  # back to the environment the process started with


def test_download_fetches_matching_files_into_the_cache_and_checks_sha256(session: HubSession) -> None:
    content = payload(50_000)
    session.hub.repos[REPO] = {
        GGUF_NAME: HubFile(content),
        "model-Q4_0.gguf": HubFile(payload(1000, seed=1)),
        "config.json": HubFile(b"{}", lfs=False),
    }

    paths = dl.download(REPO, ["*Q8_0.gguf", "config.json"])

    assert [p.name for p in paths] == ["model-Q8_0.gguf", "config.json"]
    assert paths[0].read_bytes() == content
    assert paths[0].is_relative_to(session.hf_home / "hub")
    assert COMMIT in paths[0].parts  # the snapshot of the commit the hub reported
    assert session.hub.requests_for("model-Q4_0.gguf") == []
    # a second call finds the files in the cache and transfers nothing
    session.hub.log.clear()
    assert dl.download(REPO, ["*Q8_0.gguf", "config.json"]) == paths
    assert session.hub.requests_for(GGUF_NAME) == []


def test_download_resumes_an_interrupted_transfer_with_a_range_request(session: HubSession) -> None:
    content = payload(CUT_AT * 3)
    session.hub.repos[REPO] = {GGUF_NAME: HubFile(content)}
    session.hub.cut_first_transfer_at[GGUF_NAME] = CUT_AT

    (path,) = dl.download(REPO, [GGUF_NAME])

    assert path.read_bytes() == content
    transfers = session.hub.requests_for(GGUF_NAME)
    assert [t.range for t in transfers] == [None, f"bytes={CUT_AT}-"]


def test_offline_mode_serves_cached_files_without_asking_the_hub(session: HubSession) -> None:
    content = payload(20_000)
    session.hub.repos[REPO] = {GGUF_NAME: HubFile(content), "other.gguf": HubFile(b"x")}
    (online_path,) = dl.download(REPO, ["*Q8_0.gguf"])
    session.set_offline()
    session.hub.log.clear()

    (offline_path,) = dl.download(REPO, ["*Q8_0.gguf"])

    assert offline_path == online_path
    assert offline_path.read_bytes() == content
    assert session.hub.log == []


def test_offline_mode_without_a_cached_copy_raises_download_error(session: HubSession) -> None:
    session.hub.repos[REPO] = {GGUF_NAME: HubFile(b"data")}
    session.set_offline()

    with pytest.raises(DownloadError, match="not in the local cache"):
        dl.download(REPO, [GGUF_NAME])
    assert session.hub.log == []


def test_offline_mode_names_the_pattern_missing_from_the_cache(session: HubSession) -> None:
    session.hub.repos[REPO] = {GGUF_NAME: HubFile(b"data"), "model-Q4_0.gguf": HubFile(b"four")}
    dl.download(REPO, [GGUF_NAME])
    session.set_offline()

    with pytest.raises(DownloadError, match=r"cached copy of org/model matches model-Q4_0\.gguf.*unset it"):
        dl.download(REPO, ["model-Q4_0.gguf"])


def test_missing_repo_raises_download_error_naming_it(session: HubSession) -> None:
    with pytest.raises(DownloadError, match="repository org/missing was not found"):
        dl.download("org/missing", ["x.gguf"])


def test_missing_file_raises_download_error_listing_what_exists(session: HubSession) -> None:
    session.hub.repos[REPO] = {GGUF_NAME: HubFile(b"data")}

    with pytest.raises(DownloadError, match=rf"matches nope\.gguf\. It has: {GGUF_NAME}"):
        dl.download(REPO, ["nope.gguf"])


def test_file_the_hub_cannot_resolve_raises_download_error_naming_it(session: HubSession) -> None:
    session.hub.repos[REPO] = {GGUF_NAME: HubFile(b"data", resolvable=False)}

    with pytest.raises(DownloadError, match=f"{REPO}/{GGUF_NAME} does not exist"):
        dl.download(REPO, [GGUF_NAME])


def test_missing_revision_raises_download_error(session: HubSession) -> None:
    session.hub.repos[REPO] = {GGUF_NAME: HubFile(b"data")}

    with pytest.raises(DownloadError, match="no revision 'v9'"):
        dl.download(REPO, [GGUF_NAME], revision="v9")


@pytest.mark.parametrize("into_local_dir", [False, True], ids=["cache", "local-dir"])
def test_checksum_mismatch_raises_and_leaves_no_file(session: HubSession, tmp_path: Path, into_local_dir: bool) -> None:
    session.hub.repos[REPO] = {GGUF_NAME: HubFile(payload(10_000), published_sha256="ab" * 32)}
    local_dir = tmp_path / "models" if into_local_dir else None

    with pytest.raises(DownloadError, match="sha256 mismatch"):
        dl.download(REPO, [GGUF_NAME], local_dir=local_dir)

    assert session.hub.requests_for(GGUF_NAME), "the file was transferred before being refused"
    assert session.cached_files() == []
    if local_dir is not None:
        assert not (local_dir / GGUF_NAME).exists()
        assert [p for p in local_dir.rglob("*") if p.is_file() and ".cache" not in p.parts] == []


def test_download_into_a_local_dir(session: HubSession, tmp_path: Path) -> None:
    content = payload(5_000)
    session.hub.repos[REPO] = {GGUF_NAME: HubFile(content)}

    (path,) = dl.download(REPO, [GGUF_NAME], local_dir=tmp_path / "models")

    assert path == (tmp_path / "models" / GGUF_NAME).resolve()
    assert path.read_bytes() == content


def test_alias_supplies_repo_and_file_patterns(session: HubSession) -> None:
    alias = dl.ALIASES["qwen3.6-27b-dflash"]
    session.hub.repos[alias.repo] = {
        "config.json": HubFile(b'{"a": 1}', lfs=False),
        "model.safetensors": HubFile(payload(3_000)),
        "README.md": HubFile(b"# card", lfs=False),
    }

    paths = dl.download("qwen3.6-27b-dflash")

    assert sorted(p.name for p in paths) == ["config.json", "model.safetensors"]


def test_a_name_that_is_neither_repo_nor_alias_is_refused() -> None:
    with pytest.raises(DownloadError, match="neither a hub repo id"):
        dl.resolve_source("no-such-alias")


def _cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pyllamaspec")
    download_cmd.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["download", *argv])


def test_cli_prints_the_paths_as_json(session: HubSession, capsys: pytest.CaptureFixture[str]) -> None:
    session.hub.repos[REPO] = {GGUF_NAME: HubFile(b"data")}
    args = _cli(REPO, GGUF_NAME, "--json")

    assert args.func(args) == 0

    out = json.loads(capsys.readouterr().out)
    assert [Path(p).name for p in out["files"]] == [GGUF_NAME]
    assert os.path.isfile(out["files"][0])


def test_cli_reports_errors_on_stderr_with_status_2(session: HubSession, capsys: pytest.CaptureFixture[str]) -> None:
    args = _cli("org/missing", "x.gguf")

    assert run_command(args) == 2

    captured = capsys.readouterr()
    assert captured.err.startswith("pyllamaspec: error: repository org/missing was not found")
    assert "Traceback" not in captured.err
    assert captured.out == ""


def test_cli_lists_aliases(capsys: pytest.CaptureFixture[str]) -> None:
    args = _cli("--list-aliases", "--json")

    assert args.func(args) == 0

    listed = json.loads(capsys.readouterr().out)
    assert listed["qwen3.8-27b-dflash2"]["repo"] == "z-lab/Qwen3.8-27B-DFlash2"
    assert listed["qwen3.8-27b-dflash2"]["revision"] == "50307d4c4cde6860d4eee73e2547cd786fe8e8a4"


# -- model arguments (-m / -md) that name a hub file ------------------------------------------------------


def test_model_argument_owner_repo_colon_file(session: HubSession, tmp_path: Path) -> None:
    from pyllamaspec.tools import pypi_models

    content = payload(4_000)
    session.hub.repos[REPO] = {GGUF_NAME: HubFile(content), "model-Q4_0.gguf": HubFile(b"four")}

    path = pypi_models.resolve(f"{REPO}:{GGUF_NAME}")

    assert path.name == GGUF_NAME and path.read_bytes() == content
    with pytest.raises(DownloadError, match=f"matched 2 GGUF files .*name one as {REPO}:FILE.gguf"):
        pypi_models.resolve(REPO)
    with pytest.raises(DownloadError, match="names no file after the colon"):
        pypi_models.resolve(f"{REPO}:")
    session.hub.repos["org/single"] = {"only.gguf": HubFile(b"one")}
    assert pypi_models.resolve("org/single").read_bytes() == b"one"


def test_model_argument_of_an_uncached_hub_file_offline(session: HubSession) -> None:
    from pyllamaspec.tools import pypi_models

    session.hub.repos[REPO] = {GGUF_NAME: HubFile(b"data")}
    session.set_offline()

    with pytest.raises(DownloadError, match="not in the local cache"):
        pypi_models.resolve(f"{REPO}:{GGUF_NAME}")
    assert session.hub.log == []


def test_model_argument_that_is_nothing_known(tmp_path: Path) -> None:
    from pyllamaspec.tools import pypi_models

    with pytest.raises(DownloadError, match="not a file here.*owner/repo:FILE.gguf"):
        pypi_models.resolve(str(tmp_path / "missing" / "model.gguf"))


# -- a copy already under --local-dir is never lost -------------------------------------------------------


def _local_dir_with_old_copy(session: HubSession, tmp_path: Path, new: HubFile) -> tuple[Path, bytes]:
    """local_dir holding an old version of GGUF_NAME (fetched from the hub), the hub now serving `new`."""
    old = payload(6_000, seed=7)
    session.hub.repos[REPO] = {GGUF_NAME: HubFile(old)}
    local_dir = tmp_path / "models"
    dl.download(REPO, [GGUF_NAME], local_dir=local_dir)
    session.hub.repos[REPO] = {GGUF_NAME: new}
    session.hub.log.clear()
    return local_dir, old


def test_a_failed_download_over_a_local_dir_copy_keeps_the_old_file(session: HubSession, tmp_path: Path) -> None:
    local_dir, old = _local_dir_with_old_copy(session, tmp_path, HubFile(payload(9_000, seed=8),
                                                                          published_sha256="cd" * 32))

    with pytest.raises(DownloadError, match="sha256 mismatch"):
        dl.download(REPO, [GGUF_NAME], local_dir=local_dir)

    assert session.hub.requests_for(GGUF_NAME), "the new version was transferred"
    assert (local_dir / GGUF_NAME).read_bytes() == old  # intact, byte for byte
    # the process is still usable: once the hub serves good bytes, the new version replaces the old
    new = payload(9_000, seed=8)
    session.hub.repos[REPO] = {GGUF_NAME: HubFile(new)}
    (path,) = dl.download(REPO, [GGUF_NAME], local_dir=local_dir)
    assert path == (local_dir / GGUF_NAME).resolve() and path.read_bytes() == new
    # ...and a further call finds it current and transfers nothing
    session.hub.log.clear()
    assert dl.download(REPO, [GGUF_NAME], local_dir=local_dir) == [path]
    assert session.hub.requests_for(GGUF_NAME) == []
    assert [p.name for p in local_dir.iterdir() if p.is_file()] == [GGUF_NAME]


def test_a_download_the_hub_cannot_serve_keeps_the_local_dir_copy(session: HubSession, tmp_path: Path) -> None:
    local_dir, old = _local_dir_with_old_copy(session, tmp_path, HubFile(payload(100), resolvable=False))

    with pytest.raises(DownloadError, match="does not exist"):
        dl.download(REPO, [GGUF_NAME], local_dir=local_dir)

    assert (local_dir / GGUF_NAME).read_bytes() == old


def test_a_local_dir_copy_is_replaced_only_by_a_complete_new_one(session: HubSession, tmp_path: Path) -> None:
    new = payload(3 * CUT_AT, seed=9)
    local_dir, old = _local_dir_with_old_copy(session, tmp_path, HubFile(new))
    seen = []
    real_replace = os.replace

    def replace(src, dst):  # the old copy is still whole when the new one is renamed over it
        if Path(dst) == local_dir / GGUF_NAME:
            seen.append((Path(dst).read_bytes() == old, Path(src).read_bytes() == new))
        return real_replace(src, dst)

    session.monkeypatch.setattr(dl.os, "replace", replace)
    (path,) = dl.download(REPO, [GGUF_NAME], local_dir=local_dir)

    assert seen == [(True, True)]
    assert path.read_bytes() == new


@pytest.mark.parametrize("kind", ["directory", "symlink", "fifo"])
def test_download_refuses_to_replace_what_is_not_a_regular_file(session: HubSession, tmp_path: Path,
                                                                  kind: str) -> None:
    session.hub.repos[REPO] = {GGUF_NAME: HubFile(payload(100))}
    local_dir = tmp_path / "models"
    local_dir.mkdir()
    dest = local_dir / GGUF_NAME
    target = tmp_path / "elsewhere.gguf"
    target.write_bytes(b"keep me")
    if kind == "directory":
        dest.mkdir()
    elif kind == "symlink":
        dest.symlink_to(target)
    else:
        os.mkfifo(dest)

    with pytest.raises(DownloadError, match=f"is (a directory|a symbolic link|not a regular file); refusing"):
        dl.download(REPO, [GGUF_NAME], local_dir=local_dir)

    assert target.read_bytes() == b"keep me"
    assert os.path.lexists(dest) and not (kind != "symlink" and dest.is_file())
    assert session.hub.requests_for(GGUF_NAME) == []


def test_a_hub_file_name_leading_outside_the_folder_is_refused(session: HubSession, tmp_path: Path) -> None:
    session.hub.repos[REPO] = {"../x.gguf": HubFile(b"evil"), GGUF_NAME: HubFile(b"fine")}

    with pytest.raises(DownloadError, match=r"named '\.\./x\.gguf', which would be written outside"):
        dl.download(REPO, ["*.gguf"], local_dir=tmp_path / "models")

    assert not (tmp_path / "x.gguf").exists()
    args = _cli(REPO, "../x.gguf", "--local-dir", str(tmp_path / "models"))
    assert run_command(args) == 2


def test_download_errors_say_what_happened(session: HubSession, tmp_path: Path) -> None:
    import errno as errno_mod

    session.hub.repos[REPO] = {GGUF_NAME: HubFile(payload(100))}

    def full(*a, **k):
        raise OSError(errno_mod.ENOSPC, "No space left on device")

    with session.monkeypatch.context() as mp:
        mp.setattr(dl, "hf_hub_download", full)
        with pytest.raises(DownloadError, match="disk is full") as err:
            dl.download(REPO, [GGUF_NAME])
        assert "network" not in str(err.value).lower()

    with pytest.raises(DownloadError, match="not a valid hub repo id"):
        dl.download("org/bad name!", [GGUF_NAME])

    session.set_offline()
    with pytest.raises(DownloadError, match="HF_HUB_OFFLINE is set") as err:
        dl.download(REPO, [GGUF_NAME])
    assert "check the network" not in str(err.value).lower()


def test_an_unreachable_hub_is_called_a_network_failure(session: HubSession, tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    session.monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    _reload_hub_constants(session.monkeypatch)

    with pytest.raises(DownloadError, match="network"):
        dl.download(REPO, [GGUF_NAME])


def test_model_argument_that_looks_like_a_path_is_no_such_file(tmp_path: Path, monkeypatch) -> None:
    from pyllamaspec.tools import pypi_models

    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dl, "download", lambda *a, **k: pytest.fail("the hub was asked"))

    with pytest.raises(DownloadError, match=r"no such file: 'models/draft'.*write models/draft:FILE\.gguf"):
        pypi_models.resolve("models/draft")
    (tmp_path / "models" / "draft").write_bytes(b"x")
    assert pypi_models.resolve("models/draft") == Path("models/draft")
