"""`clusterctl dashboard`: a local web dashboard of your clusters, in a process of its own.

It speaks to clusterd through the socket protocol only (`clusterctl.aio.AsyncClient`), serves
on 127.0.0.1, and needs the token of the URL it prints (see `_security.py`). Nothing here is
imported unless the `dashboard` verb runs: its web libraries would cost every other clusterctl
command its start-up time.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=0, metavar="N",
                        help="serve on 127.0.0.1:N (default: any free port)")
    parser.add_argument("--no-browser", action="store_true",
                        help="only print the URL; do not open a browser")


def _open_browser(url: str) -> None:
    """Open the URL where a graphical browser can be had, in the background: on a server with
    no display, webbrowser would start a text browser in this very terminal."""
    graphical = (os.environ.get("BROWSER") or os.environ.get("DISPLAY")
                 or os.environ.get("WAYLAND_DISPLAY") or sys.platform in ("darwin", "win32"))
    if not graphical:
        return
    import webbrowser

    threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()


def main(args: argparse.Namespace) -> int:
    """Run the dashboard until Ctrl-C; or, if one already runs for this daemon, print its URL."""
    import asyncio

    from clusterctl import paths
    from clusterctl._fail import fail, fail_with
    from clusterctl.client import Client, ClusterdError, DaemonUnavailable
    from clusterctl.protocol import PingArgs

    from ._instance import Instance

    socket_path = args.socket or paths.socket_path()

    def announce(log_path: str) -> None:
        sys.stderr.write(f"Starting clusterd (log: {log_path})...\n")

    try:  # reach (or start) the daemon first: the dashboard is of no use without it
        with Client(socket_path, autostart=False if args.no_autostart else None,
                    on_autostart=announce) as client:
            client.call(PingArgs())
    except DaemonUnavailable as error:
        fail(error.message, error.hint)
    except ClusterdError as error:
        fail_with(error)

    instance = Instance(os.path.dirname(os.path.abspath(socket_path)))
    if not instance.acquire():
        state = instance.running()
        if state is None:
            fail("another dashboard of this clusterd is starting or does not answer",
                 f"try again in a moment (its state: {instance.state_path})")
        print(f"A dashboard is already running (pid {state['pid']}):\n    {state['url']}")
        if not args.no_browser:
            _open_browser(state["url"])
        return 0

    from . import _app

    try:
        try:
            sock = _app.bind(args.port)
        except OSError as error:
            fail(f"cannot listen on 127.0.0.1:{args.port}: {error.strerror}",
                 "choose another --port, or leave it out for any free one")

        def started(url: str, port: int) -> None:
            instance.publish(url, port)
            print(f"clusterd dashboard (Ctrl-C to stop):\n    {url}", flush=True)
            if not args.no_browser:
                _open_browser(url)

        asyncio.run(_app.serve(socket_path, sock, started,
                               autostart=False if args.no_autostart else None))
    finally:
        instance.release()
    print("Dashboard stopped.", file=sys.stderr)
    return 0
