"""The bed's stand-ins for accelerator drivers, on the GPU and Neuron images (regions.IMAGES):
the bed has no GPUs, so an instance of AWS's Deep Learning Base GPU AMI gets an `nvidia-smi`
that reports the GPUs its instance type has (from moto's instance type data, as EC2 describes
them), and one of the Neuron AMI a `neuron-ls` that reports its Neuron devices. They answer
what clusterd asks of a driver (that it is there and what it sees); everything else a real
driver does is out of the bed's reach. An instance of another image has no such program, as
a real one has no driver. Standard library only.
"""

from __future__ import annotations

import json
import os
from typing import Any

from _testbed.common import write_file

NVIDIA_SMI = """#!/bin/sh
# The clusterd EC2 test bed's stand-in for NVIDIA's driver on a {itype} ({count} x {name}).
# `nvidia-smi -L`, `nvidia-smi --query-gpu=FIELDS --format=csv[,noheader]` and `nvidia-smi`.
count={count}
name='NVIDIA {name}'
mem={mem}
i=0
case "$*" in
  *-L*|*--list-gpus*)
    while [ $i -lt $count ]; do
      echo "GPU $i: $name (UUID: GPU-clusterd-testbed-{iid}-$i)"; i=$((i+1)); done ;;
  *--query-gpu=*)
    fields=$(printf '%s\\n' "$@" | sed -n 's/^--query-gpu=//p')
    case "$*" in *noheader*) ;; *) echo "$fields" | sed 's/,/, /g' ;; esac
    while [ $i -lt $count ]; do
      out=""
      for f in $(echo "$fields" | tr ',' ' '); do
        case "$f" in
          index) v=$i ;; name) v=$name ;; memory.total) v="$mem MiB" ;;
          uuid) v=GPU-clusterd-testbed-{iid}-$i ;; driver_version) v=550.127.05 ;;
          *) v="[N/A]" ;;
        esac
        out="${{out:+$out, }}$v"
      done
      echo "$out"; i=$((i+1))
    done ;;
  *)
    echo "NVIDIA-SMI 550.127.05  Driver Version: 550.127.05  (clusterd test bed stand-in)"
    while [ $i -lt $count ]; do echo "|  $i  $name  ${{mem}}MiB |"; i=$((i+1)); done ;;
esac
"""

NEURON_LS = """#!/bin/sh
# The clusterd EC2 test bed's stand-in for AWS's Neuron driver on a {itype}.
# `neuron-ls --json-output` (or -j) prints the devices as JSON, else a table.
case "$*" in
  *-j*|*json*) echo '{devices}' ;;
  *) echo "instance-type: {itype}"; echo "neuron devices: {count} x {name}" ;;
esac
"""


def accelerators(instance_type: str) -> dict[str, Any]:
    """{"gpus": [(name, count, MiB)], "neuron": [(name, count, cores)]} from moto's data."""
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    info = INSTANCE_TYPES.get(instance_type, {})
    gpus = [(g["Name"], int(g["Count"]), int(g.get("MemoryInfo", {}).get("SizeInMiB", 0)))
            for g in (info.get("GpuInfo") or {}).get("Gpus", [])]
    neuron = [(d["Name"], int(d["Count"]), int(d.get("CoreInfo", {}).get("Count", 0)))
              for d in (info.get("NeuronInfo") or {}).get("NeuronDevices", [])]
    return {"gpus": gpus, "neuron": neuron}


def write_stand_ins(bin_dir: str, driver: str, instance_type: str, instance_id: str) -> None:
    """bin_dir holds driver's stand-in for an instance of instance_type (and nothing else)."""
    os.makedirs(bin_dir, mode=0o755, exist_ok=True)
    for name in os.listdir(bin_dir):
        os.unlink(os.path.join(bin_dir, name))
    found = accelerators(instance_type)
    if driver == "nvidia":
        name, count, mem = (found["gpus"] or [("(none)", 0, 0)])[0]
        write_file(os.path.join(bin_dir, "nvidia-smi"),
                   NVIDIA_SMI.format(itype=instance_type, count=count, name=name, mem=mem,
                                     iid=instance_id), 0o755)
    elif driver == "neuron":
        name, count, cores = (found["neuron"] or [("(none)", 0, 0)])[0]
        devices = json.dumps([{"neuron_device": i, "nc_count": cores, "model": name}
                              for i in range(count)])
        write_file(os.path.join(bin_dir, "neuron-ls"),
                   NEURON_LS.format(itype=instance_type, count=count, name=name,
                                    devices=devices), 0o755)
    else:
        raise ValueError(f"no stand-in for the driver {driver!r}")
