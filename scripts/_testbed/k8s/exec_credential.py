"""The bed's exec credential plugin, as kubectl and clusterd run one (the kubeconfig's `exec`
section): asks the bed's controller for a short-lived token (tokens.py) and prints it as an
ExecCredential of the API version KUBERNETES_EXEC_INFO asks for, with its expiry unless
`--silent` (a plugin that does not say when its tokens expire).

    python3 exec_credential.py --dir DIR [--silent]

The lifetime is $CLUSTERD_TESTBED_K8S_TOKEN_TTL seconds (default 20). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))

from _testbed.common.control import Failure, request
from _testbed.k8s.layout import DEFAULT_TOKEN_TTL_S, TOKEN_TTL_ENV, BedPaths


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="exec_credential")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--silent", action="store_true", help="leave the expiry out")
    args = ap.parse_args(argv)
    info = json.loads(os.environ.get("KUBERNETES_EXEC_INFO") or "{}")
    version = info.get("apiVersion") or "client.authentication.k8s.io/v1beta1"
    ttl = float(os.environ.get(TOKEN_TTL_ENV) or DEFAULT_TOKEN_TTL_S)
    try:
        got = request(BedPaths(os.path.abspath(args.dir)).control_sock, "token", timeout=30,
                      ttl=ttl)
    except Failure as e:
        print(f"exec_credential: no token: {e}", file=sys.stderr)
        return 1
    status = {"token": got["token"]}
    if not args.silent:
        status["expirationTimestamp"] = got["expirationTimestamp"]
    print(json.dumps({"apiVersion": version, "kind": "ExecCredential", "status": status}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
