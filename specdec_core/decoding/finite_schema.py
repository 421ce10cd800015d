"""Does any finite JSON value match a schema? Refuse, at compile time, the schemas none does.

``{"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}`` demands an object
whose ``a`` is again such an object, forever. llguidance compiles it without complaint and its
matcher allows ``{"a":{"a":...`` at every step (its initial mask is not empty and it never errors),
so a request either ran until its token budget or, with a model that ends early, came back as 200
with ``content: ""`` and ``finish_reason: "stop"``: not JSON, against the README's promise. No
llguidance API says whether an accepting state is reachable (``validate_grammar`` reports nothing),
so this module answers it on the schema, as the productivity check of a context-free grammar:

a schema is *finite* when some finite value satisfies it. Every ``$ref`` target starts as "not
known finite"; a target becomes finite once its own structure needs only finite parts (an object
needs its required properties, an array its first ``minItems`` items, ``allOf`` all, ``anyOf`` /
``oneOf`` one, a scalar type, ``const`` or ``enum`` nothing); a worklist re-checks a target when
something it refers to becomes finite. What is left "not finite" at the end has no finite value.

The check is one-sided on purpose: whatever it does not understand (remote refs, keywords it does
not model, a schema with no ``type``) counts as finite, and so does any schema whose check would
take more than ``MAX_VISITS`` node visits, so a schema is only refused when it is certainly empty.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any
from urllib.parse import unquote

CONTAINERS = frozenset({"object", "array"})
MAX_VISITS = 1_000_000


class _Budget(Exception):
    """The check took too long: the schema is treated as finite."""


def has_finite_value(schema: Any) -> bool:
    """False only when no finite JSON value can match ``schema`` (see the module docstring)."""
    try:
        return _Check(schema).run()
    except (_Budget, RecursionError):
        return True


def _resolve(root: Any, ref: str) -> Any:
    """The node a local ``$ref`` ("#", "#/$defs/a~1b") points at, or None if it points nowhere."""
    node = root
    pointer = unquote(ref[1:])
    if not pointer:
        return root
    if not pointer.startswith("/"):
        return None  # an anchor ("#name"): not modelled
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


class _Check:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.finite: dict[str, bool] = {}  # local $ref -> known finite
        self.targets: dict[str, Any] = {}
        self.visits = 0

    def run(self) -> bool:
        self._collect_refs()
        dependents: defaultdict[str, set[str]] = defaultdict(set)
        todo = deque(self.targets)
        while todo:
            ref = todo.popleft()
            if self.finite[ref]:
                continue
            deps: set[str] = set()
            if self._finite(self.targets[ref], deps):
                self.finite[ref] = True
                todo.extend(dependents.pop(ref, ()))
            else:
                for dep in deps:
                    dependents[dep].add(ref)
        return self._finite(self.root, set())

    def _collect_refs(self) -> None:
        """Every local ``$ref`` that resolves, found without recursion."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            self._tick()
            if isinstance(node, dict):
                ref = node.get("$ref")
                if isinstance(ref, str) and ref.startswith("#") and ref not in self.targets:
                    target = _resolve(self.root, ref)
                    if target is not None:
                        self.targets[ref], self.finite[ref] = target, False
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)

    def _tick(self) -> None:
        self.visits += 1
        if self.visits > MAX_VISITS:
            raise _Budget

    def _finite(self, node: Any, deps: set[str]) -> bool:
        """Whether ``node`` has a finite value, given what is known of the ``$ref`` targets; the
        refs it consulted and found not (yet) finite go into ``deps``."""
        self._tick()
        if node is False:
            return False
        if not isinstance(node, dict):
            return True
        ref = node.get("$ref")
        if isinstance(ref, str) and ref in self.finite and not self.finite[ref]:
            deps.add(ref)
            return False
        for key in ("allOf",):
            if isinstance(node.get(key), list) and not all(self._finite(s, deps) for s in node[key]):
                return False
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list) and node[key] and not any(self._finite(s, deps) for s in node[key]):
                return False
        if "const" in node or isinstance(node.get("enum"), list):
            return True
        kinds = node.get("type")
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not isinstance(kinds, list) or not kinds or not CONTAINERS.issuperset(kinds):
            return True  # no type (any scalar would do), a scalar type, or one not modelled
        return ("object" in kinds and self._object_finite(node, deps)) or (
            "array" in kinds and self._array_finite(node, deps))

    def _object_finite(self, node: dict, deps: set[str]) -> bool:
        required = node.get("required")
        properties = node["properties"] if isinstance(node.get("properties"), dict) else {}
        extra = node.get("additionalProperties", True)
        if not isinstance(required, list):
            return True
        return all(self._finite(properties.get(name, extra) if isinstance(name, str) else True, deps)
                   for name in required)

    def _array_finite(self, node: dict, deps: set[str]) -> bool:
        least = node.get("minItems", 0)
        if not isinstance(least, int) or least <= 0:
            return True
        prefix = node.get("prefixItems")
        items = node.get("items", True)
        if isinstance(items, list):  # draft 4-2019 tuple form
            prefix, items = items, node.get("additionalItems", True)
        prefix = prefix if isinstance(prefix, list) else []
        needed = prefix[:least] + ([items] if least > len(prefix) else [])
        return all(self._finite(s, deps) for s in needed)
