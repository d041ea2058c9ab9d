"""The `serve` command: llama-server's flags for the model and session (shared with `generate`), plus the HTTP
ones; the server itself is `pyllamaspec.server`. The port opens first; the model loads behind it while /health
answers 503."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import socket
import sys
import threading

from .session_flags import add_memory_check_flag, add_session_flags, add_template_flags, chat_settings, open_session
from ..server import defaults
from ..server.limits import DEFAULT_MAX_BODY_BYTES, parse_size

DESCRIPTION = """\
Serve a target (and drafter) over HTTP: OpenAI's /v1/chat/completions and /v1/completions (streamed or
not), /v1/models, /health, /tokenize, /detokenize, Prometheus /metrics, and /v1/embeddings with --embeddings.
Up to -np requests generate together in one batch; --queue-size more wait for a slot, and beyond that requests
get 429."""


def _body_size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server (pip install 'pyllamaspec[server]')",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_session_flags(p, temp_default=f"{defaults.TEMPERATURE}, as llama-server; a request's temperature wins")
    g = p.add_argument_group("server")
    g.add_argument("-np", "--parallel", type=int, default=None, metavar="N",
                   help="requests generated together in one batch; n_ctx is shared among them (default: 4)")
    add_memory_check_flag(g)
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    g.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080; 0: any free port)")
    g.add_argument("-a", "--alias", default=None,
                   help="model name clients use (default: the target file's name without .gguf)")
    g.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` (all endpoints but /health and /v1/models)")
    g.add_argument("--queue-size", type=int, default=None,
                   help="requests that may wait for a slot before new ones get 429 (default 4 x -np)")
    add_template_flags(g)
    g.add_argument("--metrics", action="store_true", help="accepted for llama-server's command lines; /metrics is "
                                                          "always served")
    # llama-server's common flags, where they map
    g.add_argument("-n", "--n-predict", dest="n_predict", type=int, default=-1, metavar="N",
                   help="tokens to generate for a request that sets no max_tokens (default: -1, until the end of "
                        "the reply or the context, as llama-server)")
    g.add_argument("--jinja", action="store_true",
                   help="accepted for llama-server's command lines: chat templates always render through Jinja "
                        "(tools included)")
    g.add_argument("-cb", "--cont-batching", dest="cont_batching", action="store_true", default=True,
                   help="continuous batching (always on: requests join and leave the running batch)")
    g.add_argument("-nocb", "--no-cont-batching", dest="cont_batching", action="store_false",
                   help="refused: continuous batching cannot be switched off")
    g.add_argument("--slots", dest="slots", action="store_true", default=True,
                   help="serve /slots, the slots' state (default: on, as llama-server)")
    g.add_argument("--no-slots", dest="slots", action="store_false", help="answer /slots with 501")
    g.add_argument("--cache-reuse", type=int, default=0, metavar="N",
                   help="llama-server's KV-shift reuse of prompt chunks: only 0 is accepted (a slot reuses the "
                        "prefix its memory shares with a new prompt)")
    g.add_argument("--embeddings", "--embedding", dest="embeddings", action="store_true",
                   help="serve /v1/embeddings: the target embeds through a context of its own (pooled as its GGUF "
                        "says, mean when it names none; unit L2 norm), inputs of up to -ub tokens (default: off)")
    g.add_argument("--ignore-unknown-fields", action="store_true",
                   help="take request fields that neither OpenAI's nor llama-server's requests have, logging them "
                        "and leaving them out (default: a 400 naming the field); llama-server's and OpenAI's own "
                        "fields are honoured, or refused at a value this server cannot honour, either way")
    g.add_argument("--metrics-prefix", default="pyllamaspec",
                   help="prefix of the Prometheus metric names (default pyllamaspec; 'llamacpp' matches "
                        "llama-server's dashboards)")
    g.add_argument("--max-body-size", type=_body_size, default=DEFAULT_MAX_BODY_BYTES, metavar="SIZE",
                   help="refuse request bodies larger than SIZE with 413: bytes, or with K, M or G; 0: no limit "
                        "(default: 8M)")
    g.add_argument("--timeout-graceful-shutdown", type=float, default=10.0,
                   help="seconds to wait for open connections at shutdown (default 10)")
    p.set_defaults(func=run)


def _load(args):
    from ..server.app import Loaded

    target, drafter, session = open_session(args)
    if not args.embeddings:
        return Loaded(target, drafter, session)
    from ..config import SessionConfig
    from ..embedding import Embedder

    # as llama-server's: an input is decoded in one physical batch (-ub), at most the model's training context
    n_ubatch = args.n_ubatch if args.n_ubatch is not None else SessionConfig.n_ubatch
    n_ctx = min(n_ubatch, target.info.n_ctx_train) if target.info.n_ctx_train > 0 else n_ubatch
    try:
        embedder = Embedder(target, n_ctx, n_threads=args.n_threads_batch or args.n_threads or 0)
    except BaseException:
        session.close()
        for m in (drafter, target):
            if m is not None:
                m.close()
        raise
    return Loaded(target, drafter, session, embedder)


def _bind(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def run(args) -> int:
    try:
        import uvicorn

        from ..server.app import create_app
    except ImportError as e:
        print(f"pyllamaspec: error: `serve` needs the server extra ({e.name} is missing): "
              f"pip install 'pyllamaspec[server]'", file=sys.stderr)
        return 2
    from ..errors import ConfigError

    if args.parallel is None:
        args.parallel = 4
    if args.queue_size is not None and args.queue_size < 0:
        raise ConfigError(f"--queue-size {args.queue_size} must be >= 0")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port} must be within 0..65535")
    if not args.cont_batching:
        raise ConfigError("--no-cont-batching: continuous batching cannot be switched off (requests join and leave "
                          "the running batch); use -np 1 to run one request at a time")
    if args.cache_reuse != 0:
        raise ConfigError(f"--cache-reuse {args.cache_reuse}: reusing KV chunks by shifting is not supported; a "
                          f"slot reuses the prefix its memory shares with a new prompt (use 0)")
    if args.n_predict < -1 or args.n_predict == 0:
        raise ConfigError(f"-n/--n-predict {args.n_predict} must be -1 (no limit) or >= 1")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    logging.getLogger("pyllamaspec.server").setLevel(logging.INFO)

    server_box: list = []

    def on_fatal() -> None:
        if server_box:
            server_box[0].should_exit = True

    template, thinking = chat_settings(args)
    app = create_app(lambda: _load(args), alias=args.alias, queue_size=args.queue_size,
                     metrics_prefix=args.metrics_prefix, chat_template=template, enable_thinking=thinking,
                     api_key=args.api_key, on_fatal=on_fatal, max_body_bytes=args.max_body_size,
                     n_predict=args.n_predict, slots_endpoint=args.slots,
                     ignore_unknown_fields=args.ignore_unknown_fields,
                     **({"temperature": args.temp} if args.temp is not None else {}))
    state = app.state.server
    config = uvicorn.Config(app, log_level="info", lifespan="on",
                            timeout_graceful_shutdown=args.timeout_graceful_shutdown)
    server = _Server(config, state)
    server_box.append(server)
    sock = _bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"pyllamaspec serve: listening on http://{shown}:{port}", flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        state.close()   # when uvicorn stopped without its lifespan shutdown (a second Ctrl-C)
    if state.load_error is not None:
        err = state.load_error
        print(f"pyllamaspec: error: {err}", file=sys.stderr)
        return 2
    return 0


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, with SIGINT/SIGTERM first telling the engine to stop admitting and to end what runs
        (so open streams end and uvicorn's wait for connections is short), and a clean exit status after."""

        def __init__(self, config, state) -> None:
            super().__init__(config)
            self._state = state

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

        def handle_exit(self, sig, frame) -> None:
            # a signal handler runs between two bytecodes of the loop's own thread: only schedule the work
            loop = self._state.loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._state.begin_shutdown)
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            else:
                self.should_exit = True

    return Server


def _Server(config, state):
    return _server_class()(config, state)
