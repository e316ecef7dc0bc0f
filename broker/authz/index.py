"""ACL bindings indexed by the resources they cover, so a decision looks at a handful of them.

Scanning every binding costs a microsecond or more each in Python; a Fetch of a hundred
partitions on a cluster with a thousand ACLs would spend a tenth of a second authorizing
(``bench/authorizer.py``). The index answers "which bindings cover this resource" with a few
dictionary look-ups: the literal name, the literal wildcard ``*``, and one look-up per distinct
prefix length among the prefixed bindings of that resource type. The authorizer then decides on
those alone, which gives the same answer as deciding on all of them (a property the unit tests
check): bindings that do not cover the resource never take part in a decision.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from kafscale.broker.authz.model import WILDCARD, AclBinding, PatternType, ResourceType

_Key = tuple[ResourceType, str]


@dataclass(frozen=True, slots=True)
class AclIndex:
    literal: dict[_Key, tuple[AclBinding, ...]]
    prefixed: dict[_Key, tuple[AclBinding, ...]]
    prefix_lengths: dict[ResourceType, tuple[int, ...]]
    by_type: dict[ResourceType, tuple[AclBinding, ...]]

    @classmethod
    def build(cls, bindings: Iterable[AclBinding]) -> AclIndex:
        literal: defaultdict[_Key, list[AclBinding]] = defaultdict(list)
        prefixed: defaultdict[_Key, list[AclBinding]] = defaultdict(list)
        by_type: defaultdict[ResourceType, list[AclBinding]] = defaultdict(list)
        for b in bindings:
            by_type[b.resource_type].append(b)
            if b.pattern_type is PatternType.LITERAL:
                literal[(b.resource_type, b.resource_name)].append(b)
            elif b.pattern_type is PatternType.PREFIXED:
                prefixed[(b.resource_type, b.resource_name)].append(b)
        lengths: defaultdict[ResourceType, set[int]] = defaultdict(set)
        for resource_type, name in prefixed:
            lengths[resource_type].add(len(name))
        return cls(
            {k: tuple(v) for k, v in literal.items()},
            {k: tuple(v) for k, v in prefixed.items()},
            {k: tuple(sorted(v)) for k, v in lengths.items()},
            {k: tuple(v) for k, v in by_type.items()},
        )

    def covering(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        """The bindings whose pattern covers the resource (every principal, host, operation)."""
        found = list(self.literal.get((resource_type, name), ()))
        if name != WILDCARD:
            found.extend(self.literal.get((resource_type, WILDCARD), ()))
        for length in self.prefix_lengths.get(resource_type, ()):
            if length > len(name):
                break
            found.extend(self.prefixed.get((resource_type, name[:length]), ()))
        return found

    def of_type(self, resource_type: ResourceType) -> tuple[AclBinding, ...]:
        return self.by_type.get(resource_type, ())


EMPTY_INDEX = AclIndex.build(())
