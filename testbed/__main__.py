"""``python -m testbed up|down|demo``: the local stack for people and scripts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the stack in the background; write DIR/env")
    up.add_argument("--dir", type=Path, default=Path(".dev"))
    up.add_argument(
        "--real-node",
        action="store_true",
        help="also a real node (kubelet, containerd, kube-proxy, CoreDNS; needs root)",
    )
    down = sub.add_parser("down", help="stop what `up` started, by pid")
    down.add_argument("--dir", type=Path, default=Path(".dev"))
    sub.add_parser("demo", help="start the stack, run the main job on it, stop it")
    sub.add_parser(
        "node-clean", help="put back what a real node of a run that died left on the machine"
    )
    args = parser.parse_args(argv)

    from testbed.stack import Stack, StillRunning, stop_recorded

    if args.command == "up":
        directory = args.dir.resolve()
        if (directory / "pids.json").exists():
            print(f"{directory} already has a running stack: `make dev-down` first")
            return 1
        from testbed.process import detach

        detach()
        stack = Stack(directory).start()
        if args.real_node:
            stack.start_real_node()
            assert stack.real_node is not None
            print(f"real node {stack.real_node.started_in:.0f} s after the control plane")
        stack.start_product()
        print(f"stack up; {len(stack.servers())} processes recorded in {directory}/pids.json")
        print(f"  placement service: {stack.endpoint}")
        print(f"  source {directory}/env")
        print("  kubectl get nodes")
        print("no Location yet; one on each storage stand-in (and an Organization 'ml'):")
        print(f"  kubectl apply -f {stack.examples}")
        return 0
    if args.command == "down":
        try:
            stopped = stop_recorded(args.dir.resolve())
        except StillRunning as e:
            print(f"{e}: `make dev-down` again once it has exited")
            return 1
        print("\n".join(f"stopped {s}" for s in stopped) or "nothing was running")
        return 0
    if args.command == "node-clean":
        from testbed.node import NodeBusy, clean_dead_run

        try:
            left = clean_dead_run()
        except NodeBusy as e:
            print(e)
            return 1
        print("\n".join(left) or "nothing left")
        return 1 if left else 0
    from testbed.demo import run

    return run()


if __name__ == "__main__":
    sys.exit(main())
