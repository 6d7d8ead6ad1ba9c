"""One walk over a parsed file, kept for every rule: nodes in source order, each node's parent,
where each subtree starts and ends in that order, and the nodes of each type.

Rules ask "every assignment", "everything under this expression", "the statements of this
function" many times per file. Walking the tree for each question (``ast.walk``,
``ast.iter_child_nodes``) made reading a file cost many walks; with the index each question
is a slice or a list that already exists.
"""

from __future__ import annotations

import ast
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["TreeIndex", "index_tree"]

#: Nodes whose body is another scope: a scope's own walk does not enter them.
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module, ast.ClassDef)


@dataclass(frozen=True, eq=False)
class TreeIndex:
    """What one walk of a tree found. ``nodes[i]``'s subtree is ``nodes[i:ends[i]]``.

    The context and operator nodes (``ast.Load``, ``ast.Add`` ...) are shared by every tree
    Python parses, so their parent and position are those of their last use, as with a
    parent map built by ``ast.walk``."""

    nodes: tuple[ast.AST, ...]
    parents: dict[ast.AST, ast.AST]
    ends: list[int]
    position: dict[ast.AST, int]
    by_type: dict[type, tuple[ast.AST, ...]]
    #: Answers derived from the tree alone (never from the project), computed on first use.
    memo: dict[str, object] = field(default_factory=dict)

    def of(self, *types: type) -> tuple[ast.AST, ...]:
        """The nodes of exactly these types (no subclasses: parsed trees have none), in
        source order."""
        if len(types) == 1:
            return self.by_type.get(types[0], ())
        found = [n for t in types for n in self.by_type.get(t, ())]
        return tuple(sorted(found, key=self.position.__getitem__))

    def inside(self, node: ast.AST, kind: type) -> tuple[ast.AST, ...]:
        """The nodes of type ``kind`` in ``node``'s subtree (``node`` included), in source
        order: ``[n for n in ast.walk(node) if type(n) is kind]``, in another order."""
        at = self.position.get(node)
        if at is None or self.nodes[at] is not node:
            return tuple(n for n in ast.walk(node) if type(n) is kind)
        found = self.of(kind)
        key = f"positions:{kind.__name__}"
        if key not in self.memo:
            self.memo[key] = [self.position[n] for n in found]
        starts: list[int] = self.memo[key]  # type: ignore[assignment]
        return found[bisect_left(starts, at):bisect_left(starts, self.ends[at])]

    def owns(self, node: ast.AST) -> bool:
        """Is ``node`` a node of this tree (at the position the index gives it)?"""
        at = self.position.get(node)
        return at is not None and self.nodes[at] is node

    def subtree(self, node: ast.AST) -> tuple[ast.AST, ...]:
        """``node`` and everything below it, in source order (the nodes of ``ast.walk``,
        in another order)."""
        at = self.position.get(node)
        if at is None or self.nodes[at] is not node:
            return tuple(ast.walk(node))  # not of this tree: walk it
        return self.nodes[at:self.ends[at]]

    def walk_scope(self, scope: ast.AST) -> Iterator[ast.AST]:
        """Nodes of one scope in source order, not entering nested functions or classes."""
        at = self.position.get(scope)
        if at is None or self.nodes[at] is not scope:
            yield from _walk_scope(scope)
            return
        nodes, ends = self.nodes, self.ends
        i, end = at + 1, ends[at]
        while i < end:
            node = nodes[i]
            yield node
            i = ends[i] if isinstance(node, _NESTED) else i + 1


def _walk_scope(scope: ast.AST) -> Iterator[ast.AST]:
    stack = list(reversed(list(ast.iter_child_nodes(scope))))
    while stack:
        child = stack.pop()
        yield child
        if not isinstance(child, _NESTED):
            stack.extend(reversed(list(ast.iter_child_nodes(child))))


def index_tree(tree: ast.AST) -> TreeIndex:
    """Walk ``tree`` once, depth first in source order (as ``facts.in_order``).

    Children are read from ``_fields`` directly: ``ast.iter_child_nodes`` costs a generator
    per node, and this walk visits every node of every checked file."""
    parents: dict[ast.AST, ast.AST] = {}
    order: list[ast.AST] = []
    ends: list[int] = []
    by_type: dict[type, list[ast.AST]] = {}
    stack: list[ast.AST | int] = [tree]
    pop, push, append, close = stack.pop, stack.extend, order.append, ends.append
    name_type, constant_type, node_type = ast.Name, ast.Constant, ast.AST
    while stack:
        node = pop()
        kind = node.__class__
        if kind is int:  # every node below order[node] has been listed
            ends[node] = len(order)  # type: ignore[index]
            continue
        at = len(order)
        append(node)  # type: ignore[arg-type]
        if kind in by_type:
            by_type[kind].append(node)  # type: ignore[arg-type]
        else:
            by_type[kind] = [node]  # type: ignore[list-item]
        if kind is name_type:  # a third of all nodes: its one child is its context
            ctx = node.ctx  # type: ignore[union-attr]
            append(ctx)
            close(at + 2)
            close(at + 2)
            parents[ctx] = node  # type: ignore[assignment]
            if ctx.__class__ in by_type:
                by_type[ctx.__class__].append(ctx)
            else:
                by_type[ctx.__class__] = [ctx]
            continue
        close(at + 1)
        if kind is constant_type:  # a value, never a node
            continue
        children: list[ast.AST] = []
        for name in node._fields:  # type: ignore[union-attr]
            value = getattr(node, name, None)
            if value.__class__ is list:
                for item in value:
                    if isinstance(item, node_type):
                        children.append(item)
            elif isinstance(value, node_type):
                children.append(value)
        if children:
            for child in children:
                parents[child] = node  # type: ignore[assignment]
            children.reverse()
            stack.append(at)
            push(children)
    nodes = tuple(order)
    position = {node: i for i, node in enumerate(nodes)}
    return TreeIndex(nodes, parents, ends, position, {k: tuple(v) for k, v in by_type.items()})
