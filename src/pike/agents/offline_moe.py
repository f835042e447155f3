"""The mixture-of-experts loop, found in a task's source and rewritten (offline agent).

DeepSeek's reference MoE (and models written after it) routes tokens with a Python loop
over its experts: a host sync for the per-expert counts, then, per expert, a gather of its
tokens, three small matrix products and a scatter-add. On KernelBench level 5 that loop is
most of 7_deepseekv3_MOE_smallbatch (35x its memory floor in eager) and of
3_deepseek_v3_1gpu's MoE layers. The rewrite replaces exactly that loop in the class's
forward with one call of `_grouped_experts` (templates/offline_moe.j2), which computes
every expert's tokens in three batched products over the experts' stacked weights, and
falls back to the loop as written wherever its form does not hold at run time.

The loop matched (names free, the skip and the expert's own name optional):

    for i in range(N):
        if counts[i] == 0:
            continue
        expert = self.experts[i]
        idx, top = torch.where(indices == i)
        y[idx] += expert(x[idx]) * weights[idx, top, None]

The skip must read the routes' own counts (`counts = torch.bincount(indices.flatten(),
minlength=N).tolist()`, the loop's host sync), which are dropped with the loop where
nothing else reads them; anything else is kept as written.
"""

from __future__ import annotations

import ast
import copy
import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class GroupedForward:
    """A class whose forward had the loop: the rewritten forward's name and source."""

    class_name: str
    function_name: str
    source: str


def grouped_forwards(task_source: str) -> list[GroupedForward]:
    """The rewritten forward of each class in `task_source` whose forward routes tokens
    through its experts with the loop above; none where no class does."""
    return list(_grouped_forwards(task_source))


# a search asks for one task's source again and again (applicable, then each render):
# parsed once; frozen results, so the cache's entries cannot be changed by a caller
@functools.lru_cache(maxsize=16)
def _grouped_forwards(task_source: str) -> tuple[GroupedForward, ...]:
    try:
        tree = ast.parse(task_source)
    except SyntaxError:
        return ()
    found = []
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        forwards = [f for f in cls.body if isinstance(f, ast.FunctionDef)
                    and f.name == "forward"]
        if len(forwards) != 1 or _assigns_forward(cls):
            continue  # the last definition would be the one Python keeps: not guessed at
        forward = forwards[0]
        if forward.decorator_list or _needs_its_class(forward):
            continue
        rewritten = _rewritten(forward)
        if rewritten is not None:
            rewritten.name = f"_{cls.name}_forward_grouped"
            found.append(GroupedForward(cls.name, rewritten.name,
                                        ast.unparse(ast.fix_missing_locations(rewritten))))
    return tuple(found)


def _needs_its_class(function: ast.FunctionDef) -> bool:
    """A zero-argument super() or a private name (self.__dim, mangled to the class's
    name): either breaks once the function is written out of its class."""
    return any(isinstance(n, ast.Call) and _name(n.func) == "super"
               or isinstance(n, ast.Attribute) and n.attr.startswith("__")
               and not n.attr.endswith("__")
               or isinstance(n, ast.Name) and n.id.startswith("__") and not n.id.endswith("__")
               for n in ast.walk(function))


def _assigns_forward(cls: ast.ClassDef) -> bool:
    return any(isinstance(s, (ast.Assign, ast.AnnAssign, ast.AsyncFunctionDef))
               and "forward" in {_name(t) for t in ast.walk(s)}
               | {getattr(s, "name", None)} for s in cls.body)


def _rewritten(forward: ast.FunctionDef) -> ast.FunctionDef | None:
    """`forward` with its expert loop replaced (and the counts only the loop read
    dropped), or None where no top-level statement of it is such a loop."""
    for position, statement in enumerate(forward.body):
        loop = _expert_loop(statement) if isinstance(statement, ast.For) else None
        if loop is None:
            continue
        call, counts, bound = loop
        counted = (None if counts is None
                   else _route_counts(forward.body[:position], counts, call))
        if counts is not None and counted is None:
            return None  # a skip on anything but the routes' counts is not the loop's
        function = copy.deepcopy(forward)
        function.body[position] = ast.Expr(call)
        if any(_reads(function, name) for name in bound):
            return None  # a name the loop left bound is read after it
        if (counts is not None and counted is not None
                and not _reads(function, counts, besides=function.body[counted])):
            del function.body[counted]  # that statement alone: it only counted the routes
        return function
    return None


def _name(node: ast.AST | None) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def _is_self_attribute(node: ast.AST) -> str | None:
    """`attr` for self.attr."""
    if isinstance(node, ast.Attribute) and _name(node.value) == "self":
        return node.attr
    return None


def _expert_loop(loop: ast.For) -> tuple[ast.Call, str | None, set[str]] | None:
    """The `_grouped_experts(...)` call standing for `loop`, the name of the counts its
    skip read (None without a skip) and the names the loop binds; None where the loop is
    not the form above."""
    index = _name(loop.target)
    iterated = loop.iter
    if (index is None or loop.orelse or not isinstance(iterated, ast.Call)
            or _name(iterated.func) != "range" or len(iterated.args) != 1
            or iterated.keywords):
        return None
    body = list(loop.body)
    counts = _skip_of_empty(body[0], index) if body else None
    if counts is not None:
        body = body[1:]
    experts, expert_name = None, None
    if (body and isinstance(body[0], ast.Assign) and len(body[0].targets) == 1
            and _indexed_experts(body[0].value, index)):  # expert = self.experts[i]
        experts = _indexed_experts(body[0].value, index)
        expert_name = _name(body[0].targets[0])
        if expert_name is None:
            return None
        body = body[1:]
    if len(body) != 2:
        return None
    routed = _where_equal(body[0], index)
    if routed is None:
        return None
    idx, top, indices = routed
    added = _routed_add(body[1], idx, top)
    if added is None:
        return None
    out, called, x, weights = added
    if expert_name is not None:
        if _name(called) != expert_name:
            return None
    else:
        experts = _indexed_experts(called, index)
    if (experts is None or index in {out, x, weights, indices, idx, top, expert_name}
            or out in {x, weights, indices}):
        return None  # (the loop's later experts would read what its earlier ones added)
    call = ast.Call(
        func=ast.Name("_grouped_experts", ast.Load()),
        args=[ast.Attribute(ast.Name("self", ast.Load()), experts, ast.Load()),
              copy.deepcopy(iterated.args[0]), *(ast.Name(n, ast.Load())
                                                 for n in (x, weights, indices, out))],
        keywords=[])
    return call, counts, {n for n in (index, idx, top, expert_name) if n is not None}


def _skip_of_empty(statement: ast.stmt, index: str) -> str | None:
    """`counts` for `if counts[i] == 0: continue`."""
    if not (isinstance(statement, ast.If) and not statement.orelse
            and len(statement.body) == 1 and isinstance(statement.body[0], ast.Continue)):
        return None
    test = statement.test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq) and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == 0 and isinstance(test.left, ast.Subscript)
            and _name(test.left.slice) == index):
        return None
    return _name(test.left.value)


def _indexed_experts(node: ast.AST, index: str) -> str | None:
    """`experts` for self.experts[i]."""
    if isinstance(node, ast.Subscript) and _name(node.slice) == index:
        return _is_self_attribute(node.value)
    return None


def _where_equal(statement: ast.stmt, index: str) -> tuple[str, str, str] | None:
    """(idx, top, indices) for `idx, top = torch.where(indices == i)`."""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Tuple)
            and len(statement.targets[0].elts) == 2):
        return None
    idx, top = (_name(e) for e in statement.targets[0].elts)
    call = statement.value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr == "where" and _name(call.func.value) == "torch"
            and len(call.args) == 1 and not call.keywords):
        return None
    test = call.args[0]
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq) and _name(test.comparators[0]) == index):
        return None
    indices = _name(test.left)
    if idx is None or top is None or indices is None or idx == top:
        return None
    return idx, top, indices


def _routed_add(statement: ast.stmt, idx: str, top: str
                ) -> tuple[str, ast.expr, str, str] | None:
    """(out, the expert called, x, weights) for
    `out[idx] += expert(x[idx]) * weights[idx, top, None]` (either order of the product)."""
    if not (isinstance(statement, ast.AugAssign) and isinstance(statement.op, ast.Add)
            and isinstance(statement.target, ast.Subscript)
            and _name(statement.target.slice) == idx):
        return None
    out = _name(statement.target.value)
    product = statement.value
    if out is None or not (isinstance(product, ast.BinOp) and isinstance(product.op, ast.Mult)):
        return None
    for call, scale in ((product.left, product.right), (product.right, product.left)):
        if not (isinstance(call, ast.Call) and len(call.args) == 1 and not call.keywords):
            continue
        argument = call.args[0]
        if not (isinstance(argument, ast.Subscript) and _name(argument.slice) == idx):
            continue
        x, weights = _name(argument.value), _route_weights(scale, idx, top)
        if x is not None and weights is not None:
            return out, call.func, x, weights
    return None


def _route_weights(node: ast.AST, idx: str, top: str) -> str | None:
    """`weights` for weights[idx, top, None]."""
    if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple)):
        return None
    parts = node.slice.elts
    if (len(parts) == 3 and _name(parts[0]) == idx and _name(parts[1]) == top
            and isinstance(parts[2], ast.Constant) and parts[2].value is None):
        return _name(node.value)
    return None


def _assigns(statement: ast.stmt, name: str) -> bool:
    return (isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and _name(statement.targets[0]) == name)


def _route_counts(before: list[ast.stmt], counts: str, call: ast.Call) -> int | None:
    """Where among the statements `before` the loop `counts` is set to the routes'
    counts, or None where it may hold anything else when the loop starts: its one
    assignment there must be
    `counts = torch.bincount(indices.flatten(), minlength=N).tolist()` (`view(-1)` or
    `reshape(-1)` for flatten, `.tolist()` optional) on the loop's indices and N, and
    neither it nor the indices is bound again after it."""
    n, indices = call.args[1], _name(call.args[4])
    where = [i for i, s in enumerate(before) if counts in _bound(s)]
    if len(where) != 1 or not _assigns(before[where[0]], counts):
        return None
    after = before[where[0] + 1:]
    if any(indices in _bound(s) for s in after):
        return None
    value = before[where[0]].value  # type: ignore[attr-defined]
    if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
            and value.func.attr == "tolist" and not value.args and not value.keywords):
        value = value.func.value
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
            and value.func.attr == "bincount" and _name(value.func.value) == "torch"
            and len(value.args) == 1 and [k.arg for k in value.keywords] == ["minlength"]
            and ast.dump(value.keywords[0].value) == ast.dump(n)):
        return None
    flat = value.args[0]
    if not (isinstance(flat, ast.Call) and isinstance(flat.func, ast.Attribute)
            and _name(flat.func.value) == indices and not flat.keywords):
        return None
    minus_one = [ast.dump(a) for a in flat.args] == [ast.dump(ast.UnaryOp(
        ast.USub(), ast.Constant(1)))]
    flattened = (flat.func.attr == "flatten" and not flat.args
                 or flat.func.attr in ("view", "reshape") and minus_one)
    return where[0] if flattened else None


def _bound(statement: ast.stmt) -> set[str]:
    """The names a statement binds anywhere in it (an assignment's, a loop's, a with's)."""
    return {n.id for n in ast.walk(statement)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _reads(function: ast.FunctionDef, name: str, besides: ast.stmt | None = None) -> bool:
    """Whether `function` needs `name` bound anywhere outside `besides`: a load or a `del`
    of it, or an augmented assignment to it (`n += 1` reads n first); a plain assignment
    is no read."""
    skipped = {id(n) for n in ast.walk(besides)} if besides is not None else set()
    updated = {id(n.target) for n in ast.walk(function) if isinstance(n, ast.AugAssign)}
    return any(isinstance(n, ast.Name) and n.id == name and id(n) not in skipped
               and (isinstance(n.ctx, (ast.Load, ast.Del)) or id(n) in updated)
               for n in ast.walk(function))
