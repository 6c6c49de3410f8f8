"""PyYAML's safe loader with bounds: nesting depth and alias expansion, refused while composing.

One loader for every YAML file gpuforge reads from a place it does not control (the topology
spec, the node's health.yaml): a "billion laughs" document, a recursive alias or thousands of
nested mappings are refused before any Python object is built, as a :class:`yaml.YAMLError`
with a mark. A reader subclasses it to set its own :attr:`BoundedLoader.max_depth`,
:attr:`BoundedLoader.max_nodes` and :attr:`BoundedLoader.hint`, and bounds the text's size
before it starts. No dependency beyond PyYAML: the node's zipapp holds this module.
"""

from __future__ import annotations

from typing import Any

import yaml


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses deep nesting, recursive aliases and alias bombs."""

    #: YAML nesting depth.
    max_depth = 64
    #: YAML nodes after alias expansion.
    max_nodes = 10_000
    #: Said after the node limit: how many a real document has.
    hint = "a spec has a few hundred"

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._open: set[str] = set()  # anchors whose node is still being composed
        self._sizes: dict[int, int] = {}  # id(node) -> nodes it stands for, aliases expanded
        self._total = 0

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:  # noqa: N803 - PyYAML's name
        # PyYAML's scanner is quadratic in flow depth: refuse before it reads ahead.
        if self.flow_level >= self.max_depth:
            raise yaml.scanner.ScannerError(
                None, None, f"nested deeper than {self.max_depth} levels", self.get_mark()
            )
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        mark: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise yaml.composer.ComposerError(
                    None, None, f"recursive alias *{event.anchor}", mark
                )
            node = super().compose_node(parent, index)
            self._count(self._sizes.get(id(node), 1), mark)
            return node
        self._depth += 1
        if self._depth > self.max_depth:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {self.max_depth} levels", event.start_mark
            )
        anchor = getattr(event, "anchor", None)
        if anchor:
            self._open.add(anchor)
        node = super().compose_node(parent, index)
        if anchor:
            self._open.discard(anchor)
        self._depth -= 1
        size = 1
        if isinstance(node, yaml.SequenceNode):
            size += sum(self._sizes.get(id(child), 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            size += sum(
                self._sizes.get(id(k), 1) + self._sizes.get(id(v), 1) for k, v in node.value
            )
        self._sizes[id(node)] = size
        self._count(1, event.start_mark)
        return node

    def _count(self, nodes: int, mark: Any) -> None:
        self._total += nodes
        if self._total > self.max_nodes:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"more than {self.max_nodes} YAML nodes, aliases expanded ({self.hint})",
                mark,
            )
