"""Remote devices: ggml RPC servers (`pyllamaspec rpc-server` on each host) added to this process's device list.

An rpc-server's devices are named RPC0, RPC1, ... in the order the servers are added, after the local devices;
from then on they are devices like any other: -dev/-devd, -sm layer -ts, the memory estimate and the placement
report see them. A host that cannot be reached, or does not answer, is refused within the timeout with
RemoteDeviceError naming it; a host that goes away while a session uses it makes that session unusable
(RemoteDeviceError on the step that noticed it, and on every call after), never the process.

The protocol has no authentication and no encryption: run servers on 127.0.0.1 or a network you trust.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

from . import _native
from .config import check_rpc_timeout, parse_rpc_endpoints
from .errors import BuildError, ConfigError, RemoteDeviceError

DEFAULT_TIMEOUT = 5.0            # seconds to connect to a host and hear its handshake (ModelConfig.rpc_timeout)
SERVER_BINARY = "ggml-rpc-server"


def add_servers(endpoints: str | Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> list[dict]:
    """Connect to these rpc-servers and add their devices to this process (a server added before is not connected
    again); returns servers(). RemoteDeviceError names a host that cannot be reached or does not answer within
    `timeout` seconds; ConfigError for a malformed endpoint."""
    parsed = parse_rpc_endpoints(endpoints)
    if parsed is None:
        raise ConfigError("no RPC server given")
    timeout = check_rpc_timeout(timeout, "timeout")
    ffi, lib = _native.load()
    err = _native.ErrorBuffer(ffi)
    _native.check(lib.pls_rpc_add_servers(",".join(parsed).encode(), max(1, round(timeout * 1000)), err.buf,
                                          err.SIZE), err, RemoteDeviceError)
    return servers()


def servers() -> list[dict]:
    """The rpc-servers added to this process: endpoint, device names, whether it failed and why."""
    ffi, lib = _native.load()
    size = 4096
    for _ in range(3):
        buf = ffi.new("char[]", size)
        n = lib.pls_rpc_servers_json(buf, size)
        if n >= 0:
            return json.loads(ffi.string(buf, n).decode())
        size = -n + 1
    raise RemoteDeviceError("could not read the list of rpc-servers")


def server_binary() -> Path:
    """Upstream's rpc-server of this installation (pyllamaspec/bin), or the one beside a build tree's libraries."""
    lib = _native.lib_dir()
    for candidate in (lib.parent / "bin" / SERVER_BINARY, lib / SERVER_BINARY):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise BuildError(f"{SERVER_BINARY} is not in this installation (looked in {lib.parent / 'bin'}); reinstall "
                     f"pyllamaspec from a source checkout")
