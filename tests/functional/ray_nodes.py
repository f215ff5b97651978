"""A Ray cluster of several nodes on this machine (`ray.cluster_utils.Cluster`), driven over stdin.

Run as its own process, so that the test process can keep its own Ray session: it prints the
cluster's address, then reads commands, one per line, and answers "ok" to each:

    nodes a=1 b=1     make the worker nodes exactly these: name=CPUs (others removed, missing added)
    remove b          kill node b's raylet and its workers at once (a lost machine)
    quit              shut the cluster down

The head node has no CPUs, so every worker lands on a worker node; a node with one CPU holds one
1-CPU worker, which forces a group of 1-CPU workers onto as many nodes as it has workers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=True, head_node_args={"num_cpus": 0})
    nodes: dict[str, tuple[int, object]] = {}
    print(f"address {cluster.address}", flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "nodes":
            wanted = {name: int(cpus) for name, cpus in (arg.split("=") for arg in args)}
            for name in [n for n in nodes if nodes[n][0] != wanted.get(n)]:
                cluster.remove_node(nodes.pop(name)[1])
            for name, cpus in wanted.items():
                if name not in nodes:
                    nodes[name] = (cpus, cluster.add_node(num_cpus=cpus, resources={f"node_{name}": 1}))
            cluster.wait_for_nodes()
        elif command == "remove":
            cluster.remove_node(nodes.pop(args[0])[1], allow_graceful=False)
        elif command == "quit":
            break
        print("ok", flush=True)
    ray.shutdown()  # this process's own connection first: the head cannot be removed under it
    cluster.shutdown()


class Nodes:
    """The cluster process: its address, and `set("a=1 b=1")` / `remove("b")` for its worker nodes."""

    def __init__(self) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="ptray-")
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": "1",
                # Cluster writes its address into <ray temp dir>/ray_current_cluster, where any
                # `ray.init()` without an address on this machine would find and join it: a private
                # temp dir keeps other runs and tests off this cluster
                "RAY_TMPDIR": self.temp_dir,
                # no token authentication on this test cluster, and none expected by the runs that
                # attach (client_env): whatever mode an earlier test left in os.environ
                "RAY_AUTH_MODE": "disabled",
            },
        )
        self.address = self._answer("address ")
        self.client_env = {"RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "disabled"}

    def _answer(self, prefix: str) -> str:
        for line in self.process.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        raise RuntimeError(f"the cluster process ended (status {self.process.wait()})")

    def send(self, command: str) -> None:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        self._answer("ok")

    def set(self, spec: str) -> None:
        self.send(f"nodes {spec}")

    def remove(self, name: str) -> None:
        self.send(f"remove {name}")

    def close(self) -> None:
        try:
            self.send("quit")
        except (BrokenPipeError, RuntimeError):
            pass
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
