"""`pyllamaspec rpc-server`: upstream's ggml RPC server, whose devices a client adds with --rpc HOST:PORT.

The flags are upstream's (-H, -p, -d, -t, -c). It listens on 127.0.0.1 unless told otherwise: the protocol has no
authentication and no encryption (a client can read and write the server's memory buffers and run graphs on it),
so another address needs --expose and is announced with a warning. The server runs in place of this process
(exec): signals and the exit status are its own.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys

from ..errors import ConfigError
from ..config import RPC_DEFAULT_PORT as DEFAULT_PORT
from ..rpc import SERVER_BINARY, server_binary
from .output import warn

SECURITY = ("the RPC protocol has no authentication and no encryption: anyone who can reach {where} can read and "
            "write this machine's device memory and run computations on it. Use it on a network you trust only.")


def register(sub) -> None:
    p = sub.add_parser("rpc-server", help="serve this machine's devices to a client's --rpc (upstream's rpc-server)",
                       description="Serve this machine's devices to pyllamaspec (or llama.cpp) clients that name it "
                                   "with --rpc HOST:PORT. One client at a time.")
    p.add_argument("-H", "--host", default="127.0.0.1", metavar="ADDR",
                   help="IPv4 address to listen on; other than loopback needs --expose (default: %(default)s)")
    p.add_argument("-p", "--port", type=int, default=DEFAULT_PORT, metavar="PORT",
                   help="TCP port to listen on (default: %(default)s)")
    p.add_argument("-d", "--device", dest="devices", default=None, metavar="DEV[,DEV...]",
                   help="devices to serve, e.g. CUDA0 (default: every GPU, else the CPU)")
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help="threads of the CPU device (default: half the cores, as upstream)")
    p.add_argument("-c", "--cache", action="store_true",
                   help="keep tensors a client sends in a local file cache ($LLAMA_CACHE/rpc, else "
                        "~/.cache/llama.cpp/rpc), so the next load of the same model skips the transfer "
                        "(default: off)")
    p.add_argument("--expose", action="store_true",
                   help="allow an address other than loopback (prints a security warning) (default: loopback only)")
    p.set_defaults(func=run)


def check_listen(host: str, port: int, expose: bool) -> str:
    """The address to listen on, after refusing what upstream would misread or abort on; ConfigError otherwise."""
    if host == "localhost":
        host = "127.0.0.1"
    try:
        addr = ipaddress.IPv4Address(host)
    except ValueError:
        raise ConfigError(f"-H {host!r}: give an IPv4 address to listen on (e.g. 127.0.0.1, or 0.0.0.0 for every "
                          f"interface)") from None
    if not 1 <= port <= 65535:
        raise ConfigError(f"-p {port}: the port must be within 1..65535")
    if not addr.is_loopback and not expose:
        raise ConfigError(f"-H {host}: listening beyond this machine needs --expose; "
                          + SECURITY.format(where=f"{host}:{port}"))
    # the server binds with SO_REUSEADDR and, on failure, exits quietly: a port in use is found here first
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e} (another rpc-server there? "
                              f"choose another port with -p)") from None
    return host


def run(args: argparse.Namespace) -> int:
    host = check_listen(args.host, args.port, args.expose)
    if args.threads is not None and not 1 <= args.threads <= 512:
        raise ConfigError(f"-t {args.threads}: threads must be within 1..512")
    argv = [SERVER_BINARY, "-H", host, "-p", str(args.port)]
    if args.devices is not None:
        devices = [d.strip() for d in args.devices.split(",")]
        if not all(devices):
            raise ConfigError(f"-d {args.devices!r}: give device names separated by commas, e.g. CUDA0,CUDA1")
        from ..buildinfo import info

        here = [d["name"] for d in info()["devices"]]
        unknown = [d for d in devices if d not in here]
        if unknown:
            raise ConfigError(f"-d: unknown device {', '.join(unknown)} (devices here: {', '.join(here)})")
        argv += ["-d", ",".join(devices)]
    if args.threads is not None:
        argv += ["-t", str(args.threads)]
    if args.cache:
        argv.append("-c")
    binary = server_binary()
    if not ipaddress.IPv4Address(host).is_loopback:
        warn(SECURITY.format(where=f"{host}:{args.port}"))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(binary, argv)
    return 0  # not reached
