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
import math
import numbers
import re
from typing import Any, Sequence

from . import _native
from .errors import ConfigError, ConfigTypeError, RemoteDeviceError

DEFAULT_PORT = 50052             # upstream rpc-server's
DEFAULT_TIMEOUT = 5.0            # seconds to connect to a host and hear its handshake
_HOST = re.compile(r"^[A-Za-z0-9._-]+$")


def parse_endpoint(text: Any) -> str:
    """'HOST:PORT' (a host name or IPv4 address and a port 1..65535) as given, stripped; ConfigError otherwise."""
    if not isinstance(text, str):
        raise ConfigTypeError(f"an RPC server is a 'HOST:PORT' string, not {type(text).__name__}")
    e = text.strip()
    host, sep, port = e.rpartition(":")
    if not sep or not host or not port:
        raise ConfigError(f"RPC server '{text}' is not of the form HOST:PORT (e.g. 127.0.0.1:{DEFAULT_PORT})")
    if not _HOST.match(host):
        ipv6 = ":" in host or "[" in host
        raise ConfigError(f"RPC server '{text}': '{host}' is not a host name or IPv4 address"
                          + (" (the RPC transport speaks IPv4 only)" if ipv6 else ""))
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"RPC server '{text}': port '{port}' is not a number within 1..65535")
    return f"{host}:{int(port)}"


def parse_endpoints(value: Any, owner: str = "rpc") -> tuple[str, ...] | None:
    """None, 'HOST:PORT,HOST:PORT' or a sequence of 'HOST:PORT' -> a tuple of endpoints without repeats, or None."""
    if value is None:
        return None
    if isinstance(value, str):
        items = value.split(",")
        if any(not item.strip() for item in items):
            raise ConfigError(f"{owner}={value!r} has an empty entry; give HOST:PORT,HOST:PORT")
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        items = list(value)
    else:
        raise ConfigTypeError(f"{owner}={value!r} must be 'HOST:PORT,...' or a list of 'HOST:PORT' strings")
    out: list[str] = []
    for item in items:
        e = parse_endpoint(item)
        if e not in out:
            out.append(e)
    return tuple(out) or None


def check_timeout(value: Any, owner: str = "rpc_timeout") -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigTypeError(f"{owner}={value!r} must be a number of seconds")
    if not math.isfinite(value) or not 0.001 <= value <= 3600:
        raise ConfigError(f"{owner}={value!r} must be within 0.001..3600 seconds")
    return float(value)


def add_servers(endpoints: str | Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> list[dict]:
    """Connect to these rpc-servers and add their devices to this process (a server added before is not connected
    again); returns servers(). RemoteDeviceError names a host that cannot be reached or does not answer within
    `timeout` seconds; ConfigError for a malformed endpoint."""
    parsed = parse_endpoints(endpoints)
    if parsed is None:
        raise ConfigError("no RPC server given")
    timeout = check_timeout(timeout, "timeout")
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
