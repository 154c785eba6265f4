"""`clusterctl dashboard`: a local web dashboard of your clusters, in a process of its own.

It speaks to clusterd through the socket protocol only (`clusterctl.aio.AsyncClient`), serves
on 127.0.0.1, and lets in the browser that opens a link it prints, once (see `_security.py`).
Nothing here is imported unless the `dashboard` verb runs: its web libraries would cost every
other clusterctl command its start-up time.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

BROWSER_START_TIMEOUT_S = 10.0


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=0, metavar="N",
                        help="serve on 127.0.0.1:N (default: any free port)")
    parser.add_argument("--no-browser", action="store_true",
                        help="only print the URL; do not open a browser")


def _open_browser(url: str) -> threading.Thread | None:
    """Open the URL where a graphical browser can be had, in the background: on a server with
    no display, webbrowser would start a text browser in this very terminal."""
    graphical = (os.environ.get("BROWSER") or os.environ.get("DISPLAY")
                 or os.environ.get("WAYLAND_DISPLAY") or sys.platform in ("darwin", "win32"))
    if not graphical:
        return None
    import webbrowser

    opening = threading.Thread(target=webbrowser.open, args=(url,), daemon=True)
    opening.start()
    return opening


def _show_link(heading: str, url: str, lifetime_s: float, browser: bool) -> threading.Thread | None:
    print(f"{heading}\n    {url}\n(the link lets one browser in, within {lifetime_s:g} s; "
          "for another, run `clusterctl dashboard` again)", flush=True)
    return _open_browser(url) if browser else None


def main(args: argparse.Namespace) -> int:
    """Run the dashboard until Ctrl-C; or, if one already runs for this daemon, print (and
    open) a new link to it."""
    import asyncio
    import faulthandler
    import signal

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
        link = instance.login_link(state)
        if link is None:
            fail(f"the dashboard already running (pid {state['pid']}) gives no link",
                 f"stop it (kill {state['pid']}) and run `clusterctl dashboard` again")
        opening = _show_link(f"A dashboard is already running (pid {state['pid']}):", *link,
                             browser=not args.no_browser)
        if opening is not None:  # this process ends now: let the browser start first
            opening.join(BROWSER_START_TIMEOUT_S)
        return 0

    from . import _app
    from ._security import Guard

    try:
        try:
            sock = _app.bind(args.port)
        except OSError as error:
            fail(f"cannot listen on 127.0.0.1:{args.port}: {error.strerror}",
                 "choose another --port, or leave it out for any free one")

        def started(guard: Guard) -> None:
            instance.publish(guard.port, guard.token)
            _show_link("clusterd dashboard (Ctrl-C to stop):", guard.login_url(),
                       guard.code_lifetime_s, browser=not args.no_browser)

        # `kill -USR1 PID` prints every thread's stack to stderr: a dashboard that does not
        # stop or answer says where it is.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        asyncio.run(_app.serve(socket_path, sock, started,
                               autostart=False if args.no_autostart else None))
    finally:
        instance.release()
    print("Dashboard stopped.", file=sys.stderr)
    return 0
