"""The EC2 test bed (`scripts/testbed ec2 ...`): a real EC2 API (moto behind a counting,
fault-injecting proxy) and real machines behind it (sshd in a PID and mount namespace per running
instance), all in one network namespace that has only `lo`.

Outside the namespace, the command line (commands.py, reports.py, host_setup.py, and
runtime_image.py, which builds the runtime image's template) uses the standard library only.
Inside it, one controller process (controller.py) runs moto, the API endpoint (proxy.py,
faults.py), the regions and their images (regions.py) and the watcher that boots the nodes
(watcher.py, node_init.py); the command line talks to it over DIR/control.sock (control.py).
"""
