"""The ``hearthgate`` command: ``serve`` the gateway, ``check`` a settings file, ``reload``
its settings, ``bench``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from hearthgate.gateway.settings import Settings, SettingsError, load_settings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from hearthgate.gateway.app import create_asgi_app
    from hearthgate.gateway.serve import DrainingServer

    overrides: dict[str, object] = {}
    try:
        settings = load_settings(args.config)
        if args.host or args.port:
            listen = settings.listen.model_dump()
            listen.update({k: v for k, v in (("host", args.host), ("port", args.port)) if v})
            overrides["listen"] = listen
        if overrides:
            settings = load_settings(args.config, **overrides)
    except SettingsError as exc:
        print(f"hearthgate: {exc}", file=sys.stderr)
        return 2
    if _refused(settings, args.config):
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    app = create_asgi_app(
        settings,
        source=lambda: load_settings(args.config, **overrides),
        path=str(args.config),
    )
    config = uvicorn.Config(
        app,
        host=settings.listen.host,
        port=settings.listen.port,
        log_level=settings.log_level,
        access_log=settings.access_log,
        # uvicorn waits this long for open requests after SIGTERM; the gateway cuts them
        # itself at shutdown.drain_s, so this only bounds a request that ignores the cut.
        timeout_graceful_shutdown=int(settings.shutdown.drain_s) + 5,
        timeout_keep_alive=int(settings.listen.keep_alive_s),
        backlog=4096,
        proxy_headers=False,  # the gateway is the edge; no X-Forwarded-* to trust
        loop=settings.listen.loop,
    )
    reloader = app.app.state.reloader
    DrainingServer(config, app.gateway, on_hangup=reloader.reload).run()
    return 0


def _refused(settings: Settings, config: str) -> bool:
    """Print why ``settings`` must not be served (see Settings.exposure_problem)."""
    problem = settings.exposure_problem()
    if problem is not None:
        print(f"hearthgate: refusing to serve {config}: {problem}", file=sys.stderr)
    return problem is not None


def _check(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.config)
    except SettingsError as exc:
        print(f"hearthgate: {exc}", file=sys.stderr)
        return 2
    if _refused(settings, args.config):
        return 2
    names = ", ".join(w.name for w in settings.workers)
    print(f"{args.config}: ok ({len(settings.workers)} workers: {names})")
    if not args.live:
        return 0
    from hearthgate.gateway.livecheck import run_live_check

    return run_live_check(settings, timeout_s=args.timeout)


def _reload(args: argparse.Namespace) -> int:
    """Ask the running gateway to read its settings file again (``POST /reload``, what
    SIGHUP does) and print what it did. The file is checked here first."""
    import json
    import os
    import urllib.error
    import urllib.request

    try:
        settings = load_settings(args.config)
    except SettingsError as exc:
        print(f"hearthgate: {exc}\nthe running gateway keeps its settings", file=sys.stderr)
        return 2
    url = args.url or _local_url(settings.listen.host, settings.listen.port)
    req = urllib.request.Request(url.rstrip("/") + "/reload", method="POST", data=b"")
    key_env = args.key_env or settings.auth.admin_key_env
    key = os.environ.get(key_env, "").strip() if key_env else ""
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=args.timeout) as resp:
            outcome = json.load(resp)
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", "replace")
        try:
            outcome = json.loads(body)
        except ValueError:
            outcome = {}
        if "ok" not in outcome:
            message = outcome.get("error", {}).get("message") if outcome else body
            print(f"hearthgate: {url} answered {exc.code}: {message}", file=sys.stderr)
            return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"hearthgate: no gateway answered at {url}: {exc}", file=sys.stderr)
        return 1
    if not outcome["ok"]:
        print(f"hearthgate: reload refused, the running settings stay: {outcome['error']}")
        return 1
    print(f"reloaded: {', '.join(outcome['changed']) or 'nothing changed'}")
    if outcome["at_restart"]:
        print(f"take effect at the next start: {', '.join(outcome['at_restart'])}")
    return 0


def _local_url(host: str, port: int) -> str:
    """Where this machine reaches a gateway listening on ``host``."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


# What `pip install 'hearthgate[bench]'` adds (pyproject.toml): the gateway never imports these.
BENCH_EXTRAS = frozenset({"hypothesis", "httpx", "matplotlib", "tqdm"})


def _bench(argv: list[str]) -> int:
    try:
        from hearthgate.loadtests.cli import main as bench_main

        code: int = bench_main(argv)
    except ModuleNotFoundError as exc:
        if exc.name not in BENCH_EXTRAS:
            raise
        print(
            f"hearthgate bench: this command needs {exc.name}, part of the load tester's extras, "
            "which a gateway install leaves out: pip install 'hearthgate[bench]'",
            file=sys.stderr,
        )
        return 2
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    parser = argparse.ArgumentParser(prog="hearthgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", required=True, help="settings YAML file")
    serve.add_argument("--host", help="override listen.host")
    serve.add_argument("--port", type=int, help="override listen.port")
    serve.set_defaults(func=_serve)
    check = sub.add_parser("check", help="validate a settings file (--live: and the workers)")
    check.add_argument("config", help="settings YAML file")
    check.add_argument(
        "--live",
        action="store_true",
        help="also ask every worker what it serves and compare with the settings "
        "(exit 1 when a worker is down or disagrees)",
    )
    check.add_argument(
        "--timeout", type=float, default=30.0, help="seconds per request to a worker (--live)"
    )
    check.set_defaults(func=_check)
    reload = sub.add_parser(
        "reload", help="make the running gateway read its settings file again (as SIGHUP)"
    )
    reload.add_argument("--config", required=True, help="the settings YAML file it serves")
    reload.add_argument("--url", help="the gateway's address (default: from listen)")
    reload.add_argument(
        "--key-env", help="variable holding the admin key (default: auth.admin_key_env)"
    )
    reload.add_argument("--timeout", type=float, default=10.0, help="seconds to wait")
    reload.set_defaults(func=_reload)
    sub.add_parser("bench", help="load tests (see `hearthgate bench --help`)")
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
