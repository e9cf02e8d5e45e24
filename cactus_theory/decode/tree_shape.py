"""Tree shapes: what ``tree=`` asks the decoder to draft each step.

- ``"4,2,1"`` (static widths per depth): the root gets 4 children, each of them 2, each of
  those 1: 4 + 8 + 8 = 20 nodes, depth 3. A chain of k drafts is ``"1,1,...,1"``.
- ``"parents:0,0,1,1,2"`` (a static template): the parent of nodes 1..N (0 is the root),
  each parent before its children, siblings in the order the walk tries them. This is how
  ``"auto"`` prints its choice, so a chosen tree can be reused.
- ``"dynamic:16"`` (EAGLE-2): the draft expands ``top`` nodes per level (the ones with the
  highest path probability under the draft), each with its ``top`` most likely children,
  for ``depth`` levels; the 16 candidates with the highest path probability form the tree.
  ``"dynamic:16,depth=5,top=4"`` sets both (defaults 5 and 4).
- ``"auto"`` / ``"auto:32"``: chosen from the pair's measured costs and acceptance
  (``decode.tree_auto``; at most 32 nodes, default ``AUTO_NODES``).

Children are the draft's top-K (``children="deterministic"``, the default: EAGLE, SGLang,
vLLM) or K draws from the draft's processed law (``"with-replacement"``: SpecInfer;
``"without-replacement"``: Sequoia; ``"hub"``: SpecHub's pair, 2 children per node), per
``cactus_theory.core.trees.base``. Dynamic trees
rank nodes by the draft's path probability, so they draft deterministic children.
"""

from __future__ import annotations

from dataclasses import dataclass

from cactus_theory.core.trees.base import DETERMINISTIC, HUB, SCHEMES

#: The most nodes (beyond the root) a tree may have.
MAX_NODES = 256
#: The deepest tree.
MAX_DEPTH = 32
#: dynamic: levels drafted and nodes expanded (children each) per level, by default.
DYNAMIC_DEPTH = 5
DYNAMIC_TOP = 4
#: auto: the largest node budget it considers, by default.
AUTO_NODES = 32


@dataclass(frozen=True)
class TreeShape:
    """A parsed ``tree=`` (module docstring). ``parents`` holds a static template's parent
    of nodes 1..N (root 0); ``budget`` a dynamic tree's node count (None when static);
    ``depth`` the levels drafted; ``top`` a dynamic tree's expansion width; ``auto`` the
    largest budget "auto" may choose (None otherwise)."""

    spec: str
    parents: tuple[int, ...] | None = None
    budget: int | None = None
    depth: int = 0
    top: int = 0
    auto: int | None = None

    @property
    def nodes(self) -> int:
        """Drafted nodes per tree (beyond the root)."""
        return len(self.parents) if self.parents is not None else self.budget or 0

    @property
    def dynamic(self) -> bool:
        return self.budget is not None

    @property
    def label(self) -> str:
        """Short label for tables: the spec, or for a long template its node count."""
        if self.spec.startswith("parents:") and len(self.spec) > 24:
            return f"tree n={self.nodes} d={self.depth}"
        return self.spec

    def template_depths(self) -> list[int]:
        """Depth of nodes 0..N of a static template (root 0)."""
        if self.parents is None:
            raise ValueError("tree: a dynamic or auto tree has no fixed template")
        depth = [0]
        for parent in self.parents:
            depth.append(depth[parent] + 1)
        return depth

    def widths(self) -> list[int]:
        """Nodes per depth 1..D of a static template."""
        counts = [0] * (self.depth + 1)
        for value in self.template_depths()[1:]:
            counts[value] += 1
        return counts[1:]


def from_widths(widths: list[int]) -> tuple[int, ...]:
    """The template of static widths per depth (module docstring): parents of nodes 1..N in
    breadth-first order, each node's children together and in rank order."""
    parents: list[int] = []
    level = [0]  # node ids at the current depth
    for width in widths:
        following = []
        for parent in level:
            for _ in range(width):
                parents.append(parent)
                following.append(len(parents))
        level = following
    return tuple(parents)


def _positive(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"tree: {what} must be a positive integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"tree: {what} must be a positive integer, got {value}")
    return value


def check_template(parents: tuple[int, ...], spec: str) -> int:
    """The template's depth; ValueError naming ``tree`` unless every parent comes before
    its child and the size and depth are within ``MAX_NODES`` and ``MAX_DEPTH``."""
    if not parents:
        raise ValueError(f"tree: {spec!r} has no node")
    if len(parents) > MAX_NODES:
        raise ValueError(f"tree: {len(parents)} nodes is more than {MAX_NODES}")
    depth = [0]
    for node, parent in enumerate(parents, start=1):
        if not 0 <= parent < node:
            raise ValueError(
                f"tree: node {node}'s parent {parent} must be an earlier node (0 is the root)"
            )
        depth.append(depth[parent] + 1)
    if max(depth) > MAX_DEPTH:
        raise ValueError(f"tree: depth {max(depth)} is more than {MAX_DEPTH}")
    for node in range(2, len(parents) + 1):  # breadth-first: depths never decrease
        if depth[node] < depth[node - 1]:
            raise ValueError("tree: list the nodes breadth-first (depth by depth)")
    return max(depth)


def parse_tree(tree: str | TreeShape | None) -> TreeShape | None:
    """The ``TreeShape`` of a ``tree=`` value (None: chain decoding). ValueError naming
    ``tree`` for anything else."""
    if tree is None or isinstance(tree, TreeShape):
        return tree
    if not isinstance(tree, str) or not tree.strip():
        raise ValueError(f"tree: expected a spec such as '4,2,1' or 'dynamic:16', got {tree!r}")
    spec = tree.strip().replace(" ", "")
    name, _, rest = spec.partition(":")
    if name == "auto":
        budget = _positive(rest, "auto's node budget") if rest else AUTO_NODES
        if budget > MAX_NODES:
            raise ValueError(f"tree: auto's node budget {budget} is more than {MAX_NODES}")
        return TreeShape(spec, auto=budget)
    if name == "dynamic":
        return _dynamic(spec, rest)
    if name == "parents":
        parents = tuple(int(item) for item in _integers(rest, "parents"))
        depth = check_template(parents, spec)
        return TreeShape(spec, parents=parents, depth=depth)
    widths = [_positive(item, "every width") for item in spec.split(",")]
    nodes, level = 0, 1
    for width in widths:
        level *= width
        nodes += level
        if nodes > MAX_NODES:
            raise ValueError(f"tree: {spec!r} has more than {MAX_NODES} nodes")
    parents = from_widths(widths)
    return TreeShape(spec, parents=parents, depth=check_template(parents, spec))


def _integers(text: str, what: str) -> list[str]:
    items = [item for item in text.split(",") if item]
    if not items or not all(item.lstrip("-").isdigit() for item in items):
        raise ValueError(f"tree: {what} must be a comma-separated list of integers, got {text!r}")
    return items


def _dynamic(spec: str, rest: str) -> TreeShape:
    items = rest.split(",") if rest else []
    if not items or "=" in items[0]:
        raise ValueError(f"tree: expected 'dynamic:N' with N the node budget, got {spec!r}")
    budget = _positive(items[0], "dynamic's node budget")
    options = {"depth": DYNAMIC_DEPTH, "top": DYNAMIC_TOP}
    for item in items[1:]:
        key, _, value = item.partition("=")
        if key not in options:
            raise ValueError(f"tree: dynamic takes depth= and top=, got {key!r} in {spec!r}")
        options[key] = _positive(value, f"dynamic's {key}")
    depth, top = options["depth"], options["top"]
    if budget > MAX_NODES or depth > MAX_DEPTH:
        raise ValueError(f"tree: at most {MAX_NODES} nodes and depth {MAX_DEPTH}, got {spec!r}")
    candidates = top + (depth - 1) * top * top
    if budget > candidates:
        raise ValueError(
            f"tree: dynamic:{budget} keeps more nodes than its {candidates} candidates "
            f"(top {top} + (depth {depth} − 1) x top²); raise depth or top"
        )
    return TreeShape(spec, budget=budget, depth=depth, top=top)


def check_children(children: str, shape: TreeShape | None) -> str:
    """The drafting scheme ``children`` (``base.SCHEMES``), checked against the shape."""
    if children not in SCHEMES:
        raise ValueError(f"children: expected one of {', '.join(SCHEMES)}, got {children!r}")
    if shape is not None and shape.dynamic and children != DETERMINISTIC:
        raise ValueError(
            "children: a dynamic tree ranks nodes by the draft's path probability and drafts "
            f"deterministic children; got {children!r}"
        )
    if shape is not None and children == HUB:
        if shape.parents is None:
            raise ValueError("children: the hub scheme drafts 2 children per node; give a "
                             "static tree (e.g. '2,2,2')")  # fmt: skip
        counts = {parent: shape.parents.count(parent) for parent in set(shape.parents)}
        if set(counts.values()) != {2}:
            raise ValueError(
                f"children: the hub scheme (SpecHub) drafts 2 children per node, but "
                f"{shape.spec!r} gives some node {sorted(set(counts.values()) - {2})} children"
            )
    return children
