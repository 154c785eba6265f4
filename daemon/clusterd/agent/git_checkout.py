"""A task's git workdir on a node (the node helper's `git-checkout`): fetched at one ref, with
the credentials kept out of argv and out of the checkout."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import urllib.parse
from pathlib import Path

from clusterd.agent.helper_error import HelperError
from clusterd.node_shared.node_commands import GitCheckoutReply, GitCheckoutRequest
from clusterd.redact import redact_urls


def git_origin(url: str) -> str | None:
    """`https://host[:port]/` of an https URL (its credentials dropped); None otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() != "https" or not parts.hostname:
        return None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    port = f":{parts.port}" if parts.port else ""
    return f"https://{host}{port}/"


def split_credentials(url: str) -> tuple[str, str | None]:
    """The URL without `user:password@`, and that userinfo (decoded), if it had one."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    return (urllib.parse.urlunsplit(parts._replace(netloc=host)),
            urllib.parse.unquote(userinfo))


def git_checkout(request: GitCheckoutRequest) -> GitCheckoutReply:
    """Make `dest` a checkout of `url` at `ref` (a branch, tag or commit; default HEAD).

    Credentials never reach argv or the checkout's .git/config: a token (GIT_TOKEN, on stdin)
    or the `user:password@` of the URL (taken out of it) reach git through its environment, as
    an Authorization header scoped to the URL's own origin (`http.<origin>.extraHeader`), and
    only over https: git sends them nowhere else (curl drops the header on a redirect to another
    host), and never in the clear. `--` keeps a URL or ref from being read as an option."""
    dest = Path(request.dest).expanduser()
    url, ref = request.url, request.ref or "HEAD"
    if url.startswith("-") or str(ref).startswith("-"):
        raise HelperError("a git URL or ref may not start with '-'")
    url, userinfo = split_credentials(url)
    origin = git_origin(url)
    if userinfo is not None and origin is None:
        raise HelperError(f"{redact_urls(request.url)}: credentials in a URL are sent only "
                          "over https; use an https URL (or GIT_TOKEN)")
    if userinfo is not None:
        basic = userinfo if ":" in userinfo else f"{userinfo}:"
    elif request.token:
        basic = f"x-access-token:{request.token}"
    else:
        basic = None
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    if basic is not None and origin is not None:
        header = base64.b64encode(basic.encode()).decode()
        env.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0=f"http.{origin}.extraHeader",
                   GIT_CONFIG_VALUE_0=f"Authorization: Basic {header}")

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(dest), *args], env=env, capture_output=True,
                              text=True, timeout=float(request.timeout))
        if done.returncode != 0:
            raise HelperError(f"git {args[0]} failed: "
                              f"{redact_urls(done.stderr.strip()[-500:])}")
        return done.stdout.strip()

    if not (dest / ".git").is_dir():
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        git("init", "-q")
        git("remote", "add", "--", "origin", url)
    else:
        git("remote", "set-url", "--", "origin", url)
    git("fetch", "-q", "--depth", "1", "--", "origin", str(ref))
    git("checkout", "-q", "--force", "FETCH_HEAD", "--")
    git("clean", "-q", "-ffdx")
    return GitCheckoutReply(commit=git("rev-parse", "HEAD"),
                            credentials_sent_to=origin if basic is not None else None)
