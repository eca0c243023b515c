"""Which namespaces this operator serves, as kopf decides it from ``--namespace`` and
``--all-namespaces``: what the operator watches and what it publishes into must be the same set,
so both ask this one object, and it asks kopf's own matcher.

``--namespace`` takes plain names or kopf's patterns: comma-separated globs (``*``, ``?``), where
a part starting with ``!`` excludes (``!t-*`` serves every namespace except those starting
``t-``); a namespace is served when any one ``--namespace`` value matches it. Plain names are
served by one watch each; a pattern (or all namespaces) needs the namespaces watched too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kopf._cogs.structs.references import match_namespace

#: The characters that make a ``--namespace`` value a pattern rather than a name.
PATTERN_CHARACTERS = frozenset("*?[]!,")


@dataclass(frozen=True)
class ServedNamespaces:
    """The ``--namespace`` values (names or patterns), or all namespaces."""

    patterns: tuple[str, ...] = ()
    all_namespaces: bool = False

    @classmethod
    def of(cls, namespaces: Sequence[str], all_namespaces: bool) -> ServedNamespaces:
        return cls(tuple(dict.fromkeys(namespaces)), all_namespaces)

    @property
    def exact(self) -> tuple[str, ...] | None:
        """The served namespaces when each is a plain name; None when serving all of them or a
        pattern (the set then follows the namespaces that exist)."""
        if self.all_namespaces or any(PATTERN_CHARACTERS & set(p) for p in self.patterns):
            return None
        return self.patterns

    def serves(self, namespace: str) -> bool:
        """Whether a namespace of this name is served (kopf's matching, pattern by pattern)."""
        if self.all_namespaces:
            return True
        return any(match_namespace(namespace, p) for p in self.patterns)  # type: ignore[arg-type]
