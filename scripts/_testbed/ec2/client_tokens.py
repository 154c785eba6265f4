"""What EC2 does with RunInstances' ClientToken that moto does not: a token is bound to the
reservation it made (for 24 hours after its instances terminate, far longer than a bed lives).
The same token again with the same parameters answers that reservation, its instances as they
are now (terminated ones too), and makes nothing; with other parameters it is refused with
IdempotentParameterMismatch. A token is at most 64 ASCII characters. moto ignores the token, so
a client reusing one (re-making a lost node with the token of the launch that made it) would
get new instances from the bed and a dead reservation from EC2: the controller installs this
into its in-process moto once, so that the bed answers as EC2 does."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

log = logging.getLogger("testbed.ec2.client_tokens")

MAX_TOKEN_CHARS = 64
# What moto's response layer passes when the call had no ClientToken.
_MOTO_DEFAULT_TOKEN = "ABCDE"

_original: Any = None
_lock = threading.Lock()


def fingerprint(image_id: str, count: int, user_data: Any, security_group_names: Any,
                kwargs: dict[str, Any]) -> str:
    """The call's parameters as one comparable string (the token itself left out)."""
    params = {k: v for k, v in kwargs.items() if k != "client_token"}
    return json.dumps([image_id, count, str(user_data), security_group_names, params],
                      sort_keys=True, default=str)


def install() -> None:
    """Make moto's run_instances honour ClientToken as EC2 does (idempotent)."""
    global _original
    if _original is not None:
        return
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.instances import InstanceBackend

    class IdempotentParameterMismatch(EC2ClientError):
        code = "IdempotentParameterMismatch"

    class InvalidClientToken(EC2ClientError):
        code = "InvalidParameterValue"

    original = _original = InstanceBackend.run_instances

    def run_instances(self: Any, image_id: str, count: int, user_data: Any,
                      security_group_names: Any, **kwargs: Any) -> Any:
        token = kwargs.get("client_token")
        if not token or token == _MOTO_DEFAULT_TOKEN:
            return original(self, image_id, count, user_data, security_group_names, **kwargs)
        if len(token) > MAX_TOKEN_CHARS or not token.isascii():
            raise InvalidClientToken(f"Value ({token}) for parameter clientToken is invalid. "
                                     f"Length exceeds maximum of {MAX_TOKEN_CHARS} characters "
                                     "or contains non-ASCII characters.")
        print_ = fingerprint(image_id, count, user_data, security_group_names, kwargs)
        with _lock:  # moto's server answers from many threads
            bound: dict[str, tuple[str, Any]] = self.__dict__.setdefault(
                "_testbed_client_tokens", {})
            found = bound.get(token)
            if found is not None:
                if found[0] != print_:
                    raise IdempotentParameterMismatch(
                        "Arguments on this idempotent request are inconsistent with arguments "
                        f"used in previous request(s) with client token {token}.")
                log.info("client token %s answers its reservation %s again", token,
                         found[1].id)
                return found[1]
            reservation = original(self, image_id, count, user_data, security_group_names,
                                   **kwargs)
            bound[token] = (print_, reservation)
            return reservation

    InstanceBackend.run_instances = run_instances  # type: ignore[method-assign]


def uninstall() -> None:
    """moto as it was (for tests that share a process with other moto users)."""
    global _original
    if _original is not None:
        from moto.ec2.models.instances import InstanceBackend

        InstanceBackend.run_instances = _original  # type: ignore[method-assign]
        _original = None
