"""A local stand-in for the part of the Hugging Face Hub protocol that huggingface_hub's downloads use.

    GET  /api/models/{repo}[/revision/{rev}]   repo info: sha (commit) and siblings with size and lfs.sha256
    HEAD /{repo}/resolve/{rev}/{file}          X-Repo-Commit, ETag / X-Linked-Etag, X-Linked-Size, Content-Length
    GET  /{repo}/resolve/{rev}/{file}          the bytes; "Range: bytes=N-" answered with 206

Errors carry the hub's X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound). The server binds
127.0.0.1 on a free port, its connections time out, and it can cut the first transfer of a file short
to exercise resume.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CONNECTION_TIMEOUT_S = 5


@dataclass
class HubFile:
    content: bytes
    lfs: bool = True  # LFS files are identified by sha256; others by their git blob sha1
    published_sha256: str | None = None  # what the hub claims; None: the true sha256
    resolvable: bool = True  # False: listed in the repo info, but /resolve answers 404

    @property
    def sha256(self) -> str:
        return self.published_sha256 or hashlib.sha256(self.content).hexdigest()

    @property
    def etag(self) -> str:
        if self.lfs:
            return self.sha256
        return hashlib.sha1(b"blob %d\0" % len(self.content) + self.content).hexdigest()


@dataclass(frozen=True)
class LoggedRequest:
    method: str
    path: str
    range: str | None


@dataclass
class FakeHub:
    repos: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    # file name -> bytes after which its first GET is cut off (the connection is closed mid-body)
    cut_first_transfer_at: dict[str, int] = field(default_factory=dict)
    log: list[LoggedRequest] = field(default_factory=list)
    url: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @contextmanager
    def running(self) -> Iterator[FakeHub]:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.hub = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=CONNECTION_TIMEOUT_S)

    def requests_for(self, filename: str, method: str = "GET") -> list[LoggedRequest]:
        with self._lock:
            return [r for r in self.log if r.method == method and r.path.endswith("/" + filename)]

    def record(self, request: LoggedRequest) -> None:
        with self._lock:
            self.log.append(request)

    def take_cut(self, filename: str) -> int | None:
        """The cut-off for this transfer, once per file."""
        with self._lock:
            return self.cut_first_transfer_at.pop(filename, None)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = CONNECTION_TIMEOUT_S  # a stuck or idle keep-alive connection ends by itself

    @property
    def hub(self) -> FakeHub:
        return self.server.hub  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - keep test output quiet
        pass

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def _serve(self, send_body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.record(LoggedRequest(self.command, path, self.headers.get("Range")))
        if path.startswith("/api/models/"):
            self._repo_info(path.removeprefix("/api/models/"))
        elif "/resolve/" in path:
            repo, _, rest = path.removeprefix("/").partition("/resolve/")
            revision, _, filename = rest.partition("/")
            self._resolve(repo, revision, filename, send_body)
        else:
            self._error(404, "RepoNotFound", "no such endpoint")

    def _repo_info(self, rest: str) -> None:
        repo, _, revision = rest.partition("/revision/")
        files = self._files(repo, revision or "main")
        if files is None:
            return
        siblings = []
        for name, hub_file in files.items():
            sibling: dict[str, object] = {"rfilename": name, "size": len(hub_file.content), "blobId": hub_file.etag}
            if hub_file.lfs:
                sibling["lfs"] = {"size": len(hub_file.content), "sha256": hub_file.sha256, "pointerSize": 134}
            siblings.append(sibling)
        self._send(200, json.dumps({"id": repo, "sha": COMMIT, "siblings": siblings}).encode(),
                   {"Content-Type": "application/json"})

    def _resolve(self, repo: str, revision: str, filename: str, send_body: bool) -> None:
        files = self._files(repo, revision)
        if files is None:
            return
        hub_file = files.get(filename)
        if hub_file is None or not hub_file.resolvable:
            self._error(404, "EntryNotFound", f"{filename} not in {repo}")
            return
        content = hub_file.content
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hub_file.etag}"', "Accept-Ranges": "bytes"}
        if hub_file.lfs:
            headers |= {"X-Linked-Etag": f'"{hub_file.etag}"', "X-Linked-Size": str(len(content))}
        status, start = 200, 0
        requested = self.headers.get("Range")
        if send_body and requested and requested.startswith("bytes=") and requested.endswith("-"):
            start = int(requested.removeprefix("bytes=").removesuffix("-"))
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
        body = content[start:]
        if not send_body:
            self._send(status, b"", headers | {"Content-Length": str(len(content))}, head=True)
            return
        cut = self.hub.take_cut(filename)
        if cut is None:
            self._send(status, body, headers)
            return
        # promise the whole body, deliver part of it, then drop the connection
        self._send_headers(status, headers | {"Content-Length": str(len(body))})
        self.wfile.write(body[:cut])
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True

    def _files(self, repo: str, revision: str) -> dict[str, HubFile] | None:
        """The repo's files at ``revision``, or None after answering with the hub's error."""
        files = self.hub.repos.get(repo)
        if files is None:
            self._error(404, "RepoNotFound", f"Repository {repo} not found")
            return None
        if revision not in ("main", COMMIT):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return files

    def _error(self, status: int, code: str, message: str) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
        if code == "EntryNotFound":
            headers["X-Repo-Commit"] = COMMIT
        self._send(status, json.dumps({"error": message}).encode(), headers, head=self.command == "HEAD")

    def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool = False) -> None:
        self._send_headers(status, {"Content-Length": str(len(body))} | headers)
        if not head:
            self.wfile.write(body)

    def _send_headers(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
