"""The node helper's one error: its message reaches the daemon as the reply's `error` (and the
user), never as a traceback."""


class HelperError(Exception):
    pass
