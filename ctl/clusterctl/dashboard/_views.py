"""What the templates show: texts for resources, ages, countdowns and prices, and the Jinja2
environment (autoescaping on: every value from the daemon is text, never markup; a field an
older daemon does not send renders empty)."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import jinja2
from markupsafe import Markup, escape

from clusterctl._render import age

STATUS_CLASSES = {
    "UP": "ok", "SUCCEEDED": "ok", "RUNNING": "run", "INIT": "warn", "PENDING": "warn",
    "SETTING_UP": "warn", "STOPPED": "off", "TERMINATED": "off", "CANCELLED": "off",
    "FAILED": "bad", "FAILED_SETUP": "bad", "FAILED_DRIVER": "bad",
}


def resources(cluster: dict[str, Any]) -> str:
    nodes = cluster.get("num_nodes") or 1
    if cluster.get("instance_type"):
        spot = ", spot" if cluster.get("spot") else ""
        return f"{nodes}x({cluster['instance_type']}{spot})"
    parts = []
    if cluster.get("cpus"):
        parts.append(f"cpus={cluster['cpus']:g}")
    if cluster.get("memory_gb"):
        parts.append(f"mem={cluster['memory_gb']:.3g}GB")
    return f"{nodes}x({', '.join(parts)})" if parts else f"{nodes}x"


def autostop(cluster: dict[str, Any]) -> str:
    """The setting; the countdown is drawn beside it (and ticks in the page)."""
    if cluster.get("autostopping"):
        return "autostopping now"
    minutes = cluster.get("autostop_minutes")
    if minutes is None:
        return "-"
    action = "down" if cluster.get("autostop_down") else "stop"
    return f"{action} after {minutes:g}m idle"


def countdown(deadline: float | None, now: float | None = None) -> str:
    if not deadline:
        return ""
    left = deadline - (now or time.time())
    return "due" if left <= 0 else "in " + age(now or time.time(), until=deadline, suffix="")


def price(value: Any) -> str:
    return "-" if value is None else f"${value:,.3f}/h"


def when(ts: float | None) -> str:
    return "-" if not ts else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def change(event: dict[str, Any]) -> str:
    if event.get("kind") == "status":
        return f"{event.get('from_status') or '-'} → {event.get('to_status') or '-'}"
    return str(event.get("kind", ""))


def duration(job: dict[str, Any]) -> str:
    started = job.get("started_at")
    if not started:
        return "-"
    return age(started, until=job.get("ended_at") or time.time(), suffix="")


def digest(html: str) -> str:
    return hashlib.blake2s(html.encode(), digest_size=8).hexdigest()


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("clusterctl.dashboard", "templates"),
        autoescape=True, trim_blocks=True, lstrip_blocks=True,
    )

    def fragment(element_id: str, template: str, **values: Any) -> Markup:
        """A part of a page that live updates replace: its container carries a digest of
        its content, so an update that changes nothing leaves the page alone."""
        html = env.get_template(template).render(**values)
        return Markup('<div id="{}" data-hash="{}">{}</div>').format(
            escape(element_id), digest(html), Markup(html))

    env.globals.update(fragment=fragment, resources=resources, autostop=autostop,
                       countdown=countdown, price=price, when=when, change=change,
                       duration=duration,
                       age=age, status_class=lambda s: STATUS_CLASSES.get(str(s), ""))
    return env
