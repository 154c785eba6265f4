"""The bed's credentials, made once per bed in DIR/pki and DIR/kube: a CA of its own (openssl),
the API server's and the proxy's serving certificates, the API server's client certificate for
kubelets, the service account key pair, a static token per user and component, and the
kubeconfigs. Standard library and the openssl command only."""

from __future__ import annotations

import os
import secrets
import sys

from _testbed.common import run, write_file
from _testbed.k8s import render
from _testbed.k8s.layout import (
    ADMIN_USER,
    API_URL,
    APISERVER_URL,
    BED_IP,
    CONTEXTS,
    EXEC_CONTEXT,
    EXEC_SILENT_CONTEXT,
    KUBERNETES_SERVICE_IP,
    LOOPBACK,
    MAX_NODES,
    BedPaths,
    NodeSpec,
    node_specs,
)

DAYS = "3650"
# Components that talk to the API server, with the user and groups their tokens stand for.
COMPONENTS: dict[str, tuple[str, list[str]]] = {
    "controller-manager": ("system:kube-controller-manager", []),
    "scheduler": ("system:kube-scheduler", []),
    "kube-proxy": ("system:kube-proxy", []),
}


def _openssl(*args: str) -> None:
    run(["openssl", *args], timeout=60)


def _key(path: str) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path)
    os.chmod(path, 0o600)


def _signed(pki: str, name: str, subject: str, ext: str) -> None:
    """pki/NAME.key and pki/NAME.crt, signed by the bed's CA, with the extensions ext."""
    key, csr, crt, extfile = (os.path.join(pki, f"{name}.{s}") for s in
                              ("key", "csr", "crt", "ext"))
    _key(key)
    _openssl("req", "-new", "-key", key, "-subj", subject, "-out", csr)
    write_file(extfile, ext)
    _openssl("x509", "-req", "-in", csr, "-CA", os.path.join(pki, "ca.crt"), "-CAkey",
             os.path.join(pki, "ca.key"), "-set_serial", str(secrets.randbits(63)),
             "-days", DAYS, "-extfile", extfile, "-out", crt)
    os.unlink(csr)
    os.unlink(extfile)


def ensure_pki(paths: BedPaths) -> None:
    """The CA and certificates (kept across restarts of the bed's components)."""
    pki = paths.pki
    if os.path.isfile(os.path.join(pki, "done")):
        return
    os.makedirs(pki, mode=0o700, exist_ok=True)
    _key(os.path.join(pki, "ca.key"))
    _openssl("req", "-x509", "-new", "-key", os.path.join(pki, "ca.key"), "-subj",
             "/CN=clusterd-testbed-k8s-ca", "-days", DAYS, "-addext",
             "basicConstraints=critical,CA:TRUE", "-addext",
             "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
             "-out", os.path.join(pki, "ca.crt"))
    server = "keyUsage=critical,digitalSignature,keyEncipherment\n" \
             "extendedKeyUsage=serverAuth\n"
    client = "keyUsage=critical,digitalSignature,keyEncipherment\n" \
             "extendedKeyUsage=clientAuth\n"
    names = ",".join(["DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
                      "DNS:kubernetes.default.svc.cluster.local", "DNS:localhost",
                      f"IP:{LOOPBACK}", f"IP:{BED_IP}", f"IP:{KUBERNETES_SERVICE_IP}"])
    _signed(pki, "apiserver", "/CN=kube-apiserver", server + f"subjectAltName={names}\n")
    _signed(pki, "proxy", "/CN=clusterd-testbed-api-proxy",
            server + f"subjectAltName=DNS:localhost,IP:{LOOPBACK}\n")
    _signed(pki, "apiserver-kubelet-client", f"/CN={render.APISERVER_KUBELET_CLIENT}", client)
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out",
             os.path.join(pki, "sa.key"))
    _openssl("pkey", "-in", os.path.join(pki, "sa.key"), "-pubout", "-out",
             os.path.join(pki, "sa.pub"))
    write_file(os.path.join(pki, "done"), "")


def tokens_of(paths: BedPaths) -> dict[str, str]:
    """{user: token} for every user the bed knows, made once per bed: the admin, clusterd's
    users, the components and every node the bed could ever have (so adding nodes later never
    changes the API server's token file)."""
    have: dict[str, str] = {}
    if os.path.exists(paths.tokens):
        with open(paths.tokens) as f:
            for line in f:
                parts = line.strip().split(",")
                if len(parts) >= 2:
                    have[parts[1]] = parts[0]
    wanted = {ADMIN_USER: ["system:masters"]}
    wanted.update({user: [] for _, _, user in CONTEXTS})
    wanted.update({user: groups for user, groups in COMPONENTS.values()})
    wanted.update({f"system:node:{n.name}": ["system:nodes"]
                   for n in node_specs(MAX_NODES, MAX_NODES)})
    if set(wanted) - set(have):
        tokens = {user: have.get(user) or secrets.token_hex(24) for user in wanted}
        os.makedirs(paths.pki, mode=0o700, exist_ok=True)
        write_file(paths.tokens, render.token_file(
            [(tokens[u], u, groups) for u, groups in wanted.items()]), 0o600)
        return tokens
    return have


def write_kubeconfigs(paths: BedPaths, nodes: list[NodeSpec]) -> None:
    """clusterd's (through the proxy), the admin's and every component's (to the API server
    directly: fault rules are for clusterd's calls)."""
    tokens = tokens_of(paths)
    with open(os.path.join(paths.pki, "ca.crt"), "rb") as f:
        ca = f.read()
    os.makedirs(paths.kube, mode=0o755, exist_ok=True)
    plugin = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exec_credential.py")
    exec_users = {context: render.exec_plugin(sys.executable, plugin, paths.dir, silent)
                  for context, silent in ((EXEC_CONTEXT, False), (EXEC_SILENT_CONTEXT, True))}
    write_file(paths.kubeconfig, render.clusterd_kubeconfig(API_URL, ca, tokens, exec_users),
               0o600)
    write_file(paths.admin_kubeconfig,
               render.admin_kubeconfig(APISERVER_URL, ca, tokens[ADMIN_USER]), 0o600)
    for name, (user, _) in COMPONENTS.items():
        write_file(paths.component_kubeconfig(name),
                   render.kubeconfig(APISERVER_URL, ca, {user: tokens[user]},
                                     [(name, "default", user)], name), 0o600)
    for node in nodes:
        user = f"system:node:{node.name}"
        os.makedirs(paths.node(node.name).etc, exist_ok=True)
        write_file(paths.node(node.name).kubeconfig,
                   render.kubeconfig(APISERVER_URL, ca, {user: tokens[user]},
                                     [(node.name, "default", user)], node.name), 0o600)
