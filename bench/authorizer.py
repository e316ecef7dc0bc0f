"""What an authorization decision costs, as a function of how many ACL bindings the cluster has.

Every request a broker serves with ``authorizer.enabled`` asks ``authz.authorizer.authorize``
once per topic (Fetch: per partition), on the bindings the cache's index says cover the
resource (``authz.index``). This prints decisions per second and microseconds per decision for
a few ACL-set sizes (half literal, half prefixed, spread over 50 principals, one in ten a DENY),
for an allowed and a denied access, as the broker decides (index look-up included) and, for
comparison, scanning every binding. It measures the pure functions only (no broker); it
asserts nothing.

    .venv/bin/python bench/authorizer.py [--sizes 10 100 1000 10000] [--seconds 1]
"""

from __future__ import annotations

import argparse
import time

from kafscale.broker.authz.authorizer import Access, Policy, authorize
from kafscale.broker.authz.index import AclIndex
from kafscale.broker.authz.model import AclBinding, Operation, PatternType, Permission, ResourceType


def bindings(count: int) -> list[AclBinding]:
    made = []
    for i in range(count):
        made.append(
            AclBinding(
                ResourceType.TOPIC,
                f"topic-{i}" if i % 2 else f"team-{i}-",
                PatternType.LITERAL if i % 2 else PatternType.PREFIXED,
                f"User:user-{i % 50}",
                "*",
                Operation.READ if i % 3 else Operation.WRITE,
                Permission.DENY if i % 10 == 0 else Permission.ALLOW,
            )
        )
    return made


def rate(access: Access, acls: list[AclBinding], indexed: bool, seconds: float) -> float:
    policy = Policy()
    index = AclIndex.build(acls)
    decided = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(100):
            chosen = index.covering(access.resource_type, access.resource_name) if indexed else acls
            authorize(access, chosen, policy)
        decided += 100
    return decided / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    print(f"{'ACLs':>7} {'access':>8} {'indexed us':>11} {'decisions/s':>12} {'scan us':>9}")
    for size in args.sizes:
        acls = bindings(size)
        cases = {
            "allowed": Access(
                "User:user-1", "10.0.0.1", Operation.READ, ResourceType.TOPIC, "topic-1"
            ),
            "denied": Access(
                "User:nobody", "10.0.0.1", Operation.READ, ResourceType.TOPIC, "topic-1"
            ),
        }
        for name, access in cases.items():
            indexed = rate(access, acls, True, args.seconds)
            scanned = rate(access, acls, False, args.seconds)
            figures = f"{1e6 / indexed:>11.2f} {indexed:>12,.0f} {1e6 / scanned:>9.1f}"
            print(f"{size:>7} {name:>8} {figures}")


if __name__ == "__main__":
    main()
