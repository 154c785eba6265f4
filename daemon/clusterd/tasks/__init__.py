"""SkyPilot-compatible tasks: the typed spec and its YAML loader."""

from clusterd.tasks.common import TaskError
from clusterd.tasks.loader import load_task, parse_autostop
from clusterd.tasks.spec import Autostop, GitWorkdir, Infra, Resources, TaskSpec

__all__ = [
    "Autostop",
    "GitWorkdir",
    "Infra",
    "Resources",
    "TaskError",
    "TaskSpec",
    "load_task",
    "parse_autostop",
]
