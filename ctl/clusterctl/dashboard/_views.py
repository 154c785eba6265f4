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
from clusterctl.protocol import ManagedJobStatus

from ._costcharts import budget_bar, money, rate, share, split_bar, split_parts

STATUS_CLASSES = {
    "UP": "ok", "SUCCEEDED": "ok", "RUNNING": "run", "INIT": "warn", "PENDING": "warn",
    "SETTING_UP": "warn", "STOPPED": "off", "TERMINATED": "off", "CANCELLED": "off",
    "FAILED": "bad", "FAILED_SETUP": "bad", "FAILED_DRIVER": "bad",
    # managed jobs'
    "STARTING": "warn", "RECOVERING": "warn", "CANCELLING": "warn",
    "FAILED_PRECHECKS": "bad", "FAILED_NO_RESOURCE": "bad", "FAILED_CONTROLLER": "bad",
}
MANAGED_FINAL = frozenset(str(s) for s in ManagedJobStatus if s.is_final)


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


def seconds(value: float | None) -> str:
    """A duration given in seconds, as `age` writes it."""
    if value is None:
        return "-"
    return age(1.0, until=1.0 + value, suffix="")


def managed_running_since(job: dict[str, Any]) -> int | None:
    """For a managed job RUNNING now: when its job duration would have started had it run
    without a break, so the page can tick it (whole seconds: the same each time it is
    asked, and the fragment's digest with it)."""
    if job.get("status") != "RUNNING" or job.get("job_seconds") is None:
        return None
    return round(time.time() - float(job["job_seconds"]))


def attempts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A managed job's attempts, from its events (oldest first): each begins as the job goes
    RUNNING, and ends with its next change of status (why: that event's reason); one that
    a cancel ended shows how the cancel ended."""
    found: list[dict[str, Any]] = []
    for event in events:
        before, after = event.get("from_status"), event.get("to_status")
        if before == after:
            continue  # a decision, not a change of status
        last = found[-1] if found else None
        if last is not None and last["ended_at"] is None:
            last.update(ended_at=event["ts"], outcome=after, reason=event["reason"])
        elif last is not None and last["outcome"] == before == "CANCELLING":
            last.update(outcome=after, reason=f"{last['reason']}; {event['reason']}")
        if after == "RUNNING":
            found.append({"number": len(found) + 1, "started_at": event["ts"],
                          "started": event["reason"], "ended_at": None, "outcome": None,
                          "reason": ""})
    return found


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
                       duration=duration, seconds=seconds, attempts=attempts,
                       managed_running_since=managed_running_since,
                       managed_final=MANAGED_FINAL, money=money, rate=rate, share=share,
                       split_bar=split_bar, split_parts=split_parts, budget_bar=budget_bar,
                       age=age, status_class=lambda s: STATUS_CLASSES.get(str(s), ""))
    return env
