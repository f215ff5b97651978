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

import sys

import ray
from ray.cluster_utils import Cluster


def main() -> None:
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


if __name__ == "__main__":
    main()
