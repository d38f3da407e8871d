"""Models written in Python: restricted Python functions read as pejit programs.

    from pejit import lang as pj
    from pejit.lang import Tensor, List, f32, i64

    program = pj.Program()

    @program.type
    class Tree:                          # type Tree { Leaf(...), Node(...) }
        Leaf: Tensor[(), i64]
        Node: (Tensor[(), i64], List["Tree"])

    Row = program.alias("Row", Tensor[(1, None), f32])   # None (or "?"): a dimension known at run time

    @program.define
    def size(t: Tree) -> Tensor[(), i64]:
        match t:
            case Leaf(_):
                return 1
            case Node(_, children):
                return pj.add(1, count(children))
        ...

    engine.module.add_source(program.text(), program.name)   # or program.add_to(engine)

A decorated function is never run by Python: its source is read (ast) and
written in the pejit language, as docs/language.md defines it, so that
recursion over the data, `match` on constructors and `if` on tensor values
stay what they are: control flow that partial evaluation removes per
minibatch. What is read:

- parameters and results with type annotations (Tensor[dims, dtype] with
  None or "?" for a dimension known at run time, List[T], tuples (A, B),
  Fn[[A, B], R], the program's types and aliases; a string is a forward
  reference);
- `x = e` and `x: T = e` (a `let`), `a, b = e` (a tuple's fields), `return`;
- `if c: ... else: ...` whose branches return (an early `return` inside an
  `if` makes the rest of the function its `else`), `a if c else b`;
- `match x: case Ctor(p, q): ...` with constructor patterns (nested),
  names, `_` and tuples;
- operators as `pj.name(inputs, attr=value)` (docs/language.md), and
  + - * / // % @ unary -, comparisons, and/or/not on tensors;
- calls of the program's functions (recursion), of the prelude's (map,
  fold, ...), of constructors, and of local functions: a nested `def` is a
  closure (`fn`), capturing what it uses;
- numbers (an int is i64, a float f32), True/False, `t[0]` (a tuple's
  field), `p.w` (a record's field).

Anything else (loops, assignments to fields, lambdas without types, ...) is
a SyntaxError at its Python line. The text keeps each construct on its
Python line (add_source names the Python file), so that every later error,
the parser's, the type checker's or a run's, points at the Python line.
"""
import ast
import inspect
import sys
import textwrap

from . import _pejit

__all__ = ["Program", "Definition", "TypeExpr", "Tensor", "List", "Fn", "f32", "f64", "i64", "bool_", "ops"]


class TypeExpr:
    """A pejit type written in Python: its text in the pejit language."""

    def __init__(self, text, name=None):
        self.text, self.name = text, name

    def __getitem__(self, args):
        if self.name is None:
            raise TypeError(f"{self.text} takes no type arguments")
        args = args if isinstance(args, tuple) else (args,)
        return TypeExpr(f"{self.name}[{', '.join(_type_value(a) for a in args)}]")

    def __repr__(self):
        return f"pejit.lang type {self.text}"


class _TensorType:
    def __getitem__(self, args):
        if not (isinstance(args, tuple) and len(args) == 2):
            raise TypeError("Tensor[dims, dtype]: e.g. Tensor[(1, None), f32]")
        dims, dtype = args
        return TypeExpr(f"Tensor[{_dims_value(dims)}, {_type_value(dtype)}]")

    def __repr__(self):
        return "pejit.lang.Tensor"


class _ListType:
    def __getitem__(self, element):
        return TypeExpr(f"List[{_type_value(element)}]")


class _FnType:
    def __getitem__(self, args):
        params, result = args
        return TypeExpr(f"fn({', '.join(_type_value(p) for p in params)}) -> {_type_value(result)}")


def _dims_value(dims):
    dims = dims if isinstance(dims, tuple) else (dims,)
    text = ", ".join("?" if d is None or d == "?" else str(int(d)) for d in dims)
    return f"({text},)" if len(dims) == 1 else f"({text})"


def _type_value(t):
    if isinstance(t, TypeExpr):
        return t.text
    if isinstance(t, str):
        return t
    if isinstance(t, tuple):
        return "(" + ", ".join(_type_value(x) for x in t) + ("," if len(t) == 1 else "") + ")"
    raise TypeError(f"not a pejit type: {t!r}")


Tensor, List, Fn = _TensorType(), _ListType(), _FnType()
f32, f64, i64, bool_ = TypeExpr("f32"), TypeExpr("f64"), TypeExpr("i64"), TypeExpr("bool")
_DTYPES = {"f32", "f64", "i64", "bool"}


class _Ops:
    """pj.ops.name(...) and pj.name(...) are the operator `name` (docs/language.md)."""

    def __getattr__(self, name):
        raise TypeError(f"pejit operators are read in decorated functions, not called from Python ({name})")


ops = _Ops()

_PRELUDE = _pejit.prelude_names()  # what every module has on use (ir/prelude.h)
PRELUDE_FUNCTIONS, PRELUDE_CONSTRUCTORS = set(_PRELUDE["functions"]), set(_PRELUDE["constructors"])
_BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "floor_div",
           ast.Mod: "mod", ast.MatMult: "matmul", ast.Pow: "pow"}
_COMPARE = {ast.Gt: "greater", ast.Lt: "less", ast.GtE: "greater_equal", ast.LtE: "less_equal",
            ast.Eq: "equal", ast.NotEq: "not_equal"}


class Definition:
    """A function of a Program (what @program.define returns): it is read, not run."""

    def __init__(self, program, fn):
        self.program, self.fn, self.name = program, fn, fn.__name__

    def __call__(self, *args, **kwargs):
        raise TypeError(f"@{self.name} is a pejit definition: add the program to an engine and call its entry "
                        f"(engine.entry('{self.name}'))")

    def __repr__(self):
        return f"<pejit definition @{self.name}>"


class _Source:
    """A declaration's Python source: its file, first line and syntax tree."""

    def __init__(self, obj):
        lines, self.first = inspect.getsourcelines(obj)
        self.file = inspect.getsourcefile(obj) or "<python>"
        tree = ast.parse(textwrap.dedent("".join(lines)))
        ast.increment_lineno(tree, self.first - 1)
        self.node = tree.body[0]
        self.env = dict(obj.__globals__) if hasattr(obj, "__globals__") else dict(sys.modules[obj.__module__].__dict__)
        if hasattr(obj, "__code__"):
            self.env.update(inspect.getclosurevars(obj).nonlocals)

    def error(self, node, message):
        line = getattr(node, "lineno", self.first)
        text = None
        try:
            with open(self.file) as f:
                text = f.read().splitlines()[line - 1]
        except (OSError, IndexError):
            pass
        return SyntaxError(message, (self.file, line, getattr(node, "col_offset", 0) + 1, text))


class _Writer:
    """Text whose constructs start on their Python lines when they can."""

    def __init__(self):
        self.parts, self.line = [], 1

    def goto(self, line):
        if line and line > self.line:
            self.parts.append("\n" * (line - self.line))
            self.line = line

    def write(self, text):
        self.parts.append(text)
        self.line += text.count("\n")

    def text(self):
        return "".join(self.parts)


class Program:
    """Types, aliases and functions written in Python, as one pejit source."""

    def __init__(self, name=None):
        self.name = name  # add_source's name: the first declaration's file when None
        self._decls = []  # (kind, source or None, payload), in declaration order
        self._functions, self._constructors = set(), set()

    # ---- declarations ---------------------------------------------------------------------------

    def type(self, cls):
        """An ADT: each annotated attribute of the class is a constructor, its fields the annotation
        (a type, a tuple of types, or () for none)."""
        source = _Source(cls)
        for stmt in source.node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                self._constructors.add(stmt.target.id)
        self._decls.append(("type", source, cls.__name__))
        return TypeExpr(cls.__name__, cls.__name__)

    def record(self, cls):
        """A record type: the class's annotated attributes are its fields, in order."""
        self._decls.append(("record", _Source(cls), cls.__name__))
        return TypeExpr(cls.__name__, cls.__name__)

    def alias(self, name, type_):
        """`type name = type_;`: returns the alias, to annotate with."""
        caller = inspect.stack()[1]
        self._decls.append(("alias", (caller.filename, caller.lineno), (name, _type_value(type_))))
        return TypeExpr(name, name)

    def define(self, fn):
        """A function of the program (see the module's docstring); returns its Definition."""
        definition = Definition(self, fn)
        self._functions.add(definition.name)
        self._decls.append(("def", _Source(fn), definition))
        return definition

    # ---- the text ----------------------------------------------------------------------------------

    def source_name(self):
        if self.name:
            return self.name
        for kind, source, _ in self._decls:
            return source[0] if kind == "alias" else source.file
        return "<python>"

    def text(self):
        """The program in the pejit language; SyntaxError at the Python line of what cannot be read."""
        main = self.source_name()
        aligned, others = _Writer(), _Writer()
        for kind, source, payload in self._decls:
            file = source[0] if kind == "alias" else source.file
            w = aligned if file == main else others
            line = source[1] if kind == "alias" else source.first
            if w is aligned and line < w.line:
                w = others  # declared above text already written (another order): no alignment
            if w is aligned:
                w.goto(line)
            elif w.parts:
                w.write("\n")
            if kind == "alias":
                w.write(f"type {payload[0]} = {payload[1]};")
            elif kind == "def":
                _Translator(self, source).definition(w)
            else:
                _Translator(self, source).type_declaration(w, kind)
        tail = others.text()
        return aligned.text() + ("\n" + tail if tail else "") + "\n"

    def add_to(self, engine):
        """Adds the program to an engine's module, named by its Python file; returns the names added."""
        return engine.module.add_source(self.text(), self.source_name())


class _Translator:
    def __init__(self, program, source):
        self.program, self.source = program, source
        self.hidden = 0

    def error(self, node, message):
        return self.source.error(node, message)

    def lookup(self, name):
        return self.source.env.get(name, _MISSING)

    # ---- types -------------------------------------------------------------------------------------

    def type_text(self, node):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                return self.type_text(ast.parse(node.value, mode="eval").body)
            if node.value is None:
                return "?"
        if isinstance(node, ast.Name):
            value = self.lookup(node.id)
            if isinstance(value, TypeExpr):
                return value.name or value.text
            return node.id  # declared later, a type parameter, or the pejit name itself
        if isinstance(node, ast.Attribute):
            value = self._resolve(node)
            if isinstance(value, TypeExpr):
                return value.name or value.text
        if isinstance(node, ast.Tuple):
            items = [self.type_text(e) for e in node.elts]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if isinstance(node, ast.Subscript):
            base = self._resolve(node.value)
            args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if isinstance(base, _TensorType):
                if len(args) != 2:
                    raise self.error(node, "Tensor[dims, dtype]: e.g. Tensor[(1, None), f32]")
                dims = args[0].elts if isinstance(args[0], ast.Tuple) else [args[0]]
                text = ", ".join(self.dim_text(d) for d in dims)
                return f"Tensor[({text}{',' if len(dims) == 1 else ''}), {self.type_text(args[1])}]"
            if isinstance(base, _ListType):
                return f"List[{self.type_text(args[0])}]"
            if isinstance(base, _FnType):
                if len(args) != 2 or not isinstance(args[0], ast.List):
                    raise self.error(node, "Fn[[A, B], R]: a function type")
                params = ", ".join(self.type_text(p) for p in args[0].elts)
                return f"fn({params}) -> {self.type_text(args[1])}"
            name = base.name if isinstance(base, TypeExpr) and base.name else getattr(node.value, "id", None)
            if name:
                return f"{name}[{', '.join(self.type_text(a) for a in args)}]"
        raise self.error(node, "not a pejit type (Tensor[dims, dtype], List[T], a tuple, Fn[[A], R] or a "
                               "declared type)")

    def dim_text(self, node):
        if isinstance(node, ast.Constant) and (node.value is None or node.value == "?"):
            return "?"
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return str(node.value)
        raise self.error(node, "a dimension is an int, or None (or \"?\") for one known at run time")

    def _resolve(self, node):
        """The Python value a Name or a dotted name refers to (_MISSING when none)."""
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, ast.Attribute):
            base = self._resolve(node.value)
            if base is _MISSING:
                return _MISSING
            return getattr(base, node.attr, _MISSING) if not isinstance(base, _Ops) else _MISSING
        return _MISSING

    def type_declaration(self, w, kind):
        node = self.source.node
        w.goto(node.lineno)
        fields = []
        for stmt in node.body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # a docstring
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is None):
                raise self.error(stmt, f"a {'record' if kind == 'record' else 'type'} class holds only "
                                       "annotations (name: type)")
            fields.append(stmt)
        if kind == "record":
            body = ", ".join(f"{f.target.id}: {self.type_text(f.annotation)}" for f in fields)
            w.write(f"type {node.name} = {{{body}}};")
            return
        w.write(f"type {node.name} {{")
        for i, f in enumerate(fields):
            w.goto(f.lineno)
            ann = f.annotation
            if isinstance(ann, ast.Tuple):
                inner = ", ".join(self.type_text(e) for e in ann.elts)
                w.write(f" {f.target.id}({inner})" if ann.elts else f" {f.target.id}")
            else:
                w.write(f" {f.target.id}({self.type_text(ann)})")
            w.write("," if i + 1 < len(fields) else " ")
        w.write("}")

    # ---- functions ---------------------------------------------------------------------------------

    def definition(self, w):
        node = self.source.node
        if not isinstance(node, ast.FunctionDef):
            raise self.error(node, "@define takes a function")
        w.goto(node.lineno)
        w.write(f"def @{node.name}(")
        scope = self.params(node, w)
        w.write(f") -> {self.type_text(node.returns)} {{ " if node.returns else ") { ")
        self.block(node.body, w, scope, node)
        w.write(" }")

    def params(self, node, w):
        a = node.args
        if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or a.defaults:
            raise self.error(node, "parameters are plain names with types (no defaults, *args or keywords)")
        scope = set()
        for i, p in enumerate(a.args):
            if p.annotation is None:
                raise self.error(p, f"parameter {p.arg} needs a type annotation")
            w.write(("" if i == 0 else ", ") + f"%{p.arg}: {self.type_text(p.annotation)}")
            scope.add(p.arg)
        return scope

    def block(self, stmts, w, scope, owner):
        """Writes the statements as one expression: lets, then what the last returns."""
        scope = set(scope)
        stmts = [s for i, s in enumerate(stmts) if not (i == 0 and _is_docstring(s)) and not isinstance(s, ast.Pass)]
        for i, s in enumerate(stmts):
            last = i + 1 == len(stmts)
            w.goto(s.lineno)
            if isinstance(s, ast.Return):
                if not last:
                    raise self.error(stmts[i + 1], "unreachable: a statement after return")
                if s.value is None:
                    raise self.error(s, "return a value")
                self.expr(s.value, w, scope)
                return
            if isinstance(s, ast.Assign):
                if len(s.targets) != 1:
                    raise self.error(s, "one target per assignment")
                self.assign(s.targets[0], s.value, None, w, scope)
            elif isinstance(s, ast.AnnAssign):
                if s.value is None or not isinstance(s.target, ast.Name):
                    raise self.error(s, "x: T = value binds a name")
                self.assign(s.target, s.value, s.annotation, w, scope)
            elif isinstance(s, ast.FunctionDef):
                if s.decorator_list:
                    raise self.error(s, "a nested function takes no decorators")
                w.write(f"let %{s.name} = fn (")
                inner = self.params(s, w) | scope | {s.name}
                w.write(f") -> {self.type_text(s.returns)} {{ " if s.returns else ") { ")
                self.block(s.body, w, inner, s)
                w.write(" }; ")
                scope.add(s.name)
            elif isinstance(s, ast.If):
                if not _terminal(s.body):
                    raise self.error(s, "each branch of an if returns (an if is an expression in pejit)")
                w.write("if (")
                self.expr(s.test, w, scope)
                w.write(") { ")
                self.block(s.body, w, scope, s)
                w.write(" } else { ")
                if s.orelse:
                    if not last:
                        raise self.error(stmts[i + 1], "unreachable: both branches of the if above return")
                    if not _terminal(s.orelse):
                        raise self.error(s.orelse[-1], "each branch of an if returns")
                    self.block(s.orelse, w, scope, s)
                else:
                    if last:
                        raise self.error(s, "the function goes on when this if's condition is false: return "
                                            "a value after it, or write an else")
                    self.block(stmts[i + 1:], w, scope, owner)
                w.write(" }")
                return
            elif isinstance(s, ast.Match):
                if not last:
                    raise self.error(stmts[i + 1], "unreachable: every case of the match above returns")
                self.match(s, w, scope)
                return
            elif isinstance(s, (ast.For, ast.While, ast.AsyncFor)):
                raise self.error(s, "loops are written as recursion (a function calling itself) in pejit")
            else:
                raise self.error(s, f"a {type(s).__name__} statement is not read (assignments, return, if, "
                                    "match and nested defs are)")
        raise self.error(stmts[-1] if stmts else owner, "the function ends without returning a value")

    def assign(self, target, value, annotation, w, scope):
        if isinstance(target, ast.Name):
            ann = f": {self.type_text(annotation)}" if annotation is not None else ""
            w.write(f"let %{target.id}{ann} = ")
            self.expr(value, w, scope)
            w.write("; ")
            scope.add(target.id)
            return
        if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
            self.hidden += 1
            whole = f"tuple_{self.hidden}_"
            w.write(f"let %{whole} = ")
            self.expr(value, w, scope)
            w.write("; ")
            for k, e in enumerate(target.elts):
                w.write(f"let %{e.id} = %{whole}.{k}; ")
                scope.add(e.id)
            return
        raise self.error(target, "an assignment binds a name, or names from a tuple (a, b = ...)")

    def match(self, s, w, scope):
        w.write("match (")
        self.expr(s.subject, w, scope)
        w.write(") { ")
        for k, case in enumerate(s.cases):
            if case.guard is not None:
                raise self.error(case.guard, "a case has no guard in pejit: match, then if")
            w.goto(case.pattern.lineno)
            bound = set()
            w.write(self.pattern(case.pattern, bound) + " => { ")
            if not _terminal(case.body):
                raise self.error(case.body[-1], "each case of a match returns")
            self.block(case.body, w, scope | bound, case)
            w.write(" }" + (", " if k + 1 < len(s.cases) else " "))
        w.write("}")

    def pattern(self, p, bound):
        if isinstance(p, ast.MatchAs):
            if p.pattern is not None:
                raise self.error(p, "'pattern as name' is not read: bind the parts by name")
            if p.name is None:
                return "_"
            if self.is_constructor(p.name):
                return p.name  # `case Nil:` means the constructor, as Nil() does
            bound.add(p.name)
            return f"%{p.name}"
        if isinstance(p, ast.MatchClass):
            name = self.constructor_name(p.cls)
            if p.kwd_patterns:
                raise self.error(p, "constructor fields are matched by position")
            if not p.patterns:
                return name
            return f"{name}(" + ", ".join(self.pattern(q, bound) for q in p.patterns) + ")"
        if isinstance(p, ast.MatchSingleton) and p.value is None:
            return "None"  # the prelude's Option constructor
        if isinstance(p, ast.MatchSequence):
            items = [self.pattern(q, bound) for q in p.patterns]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        raise self.error(p, "patterns are constructors, names, _ and tuples")

    def constructor_name(self, node):
        if isinstance(node, ast.Name) and self.is_constructor(node.id):
            return node.id
        if isinstance(node, ast.Attribute) and isinstance(self._resolve(node.value), TypeExpr):
            return node.attr  # Tree.Leaf
        raise self.error(node, f"{ast.unparse(node)} is not a constructor of the program's types")

    def is_constructor(self, name):
        return name in self.program._constructors or name in PRELUDE_CONSTRUCTORS

    # ---- expressions -------------------------------------------------------------------------------

    def expr(self, e, w, scope):
        w.goto(getattr(e, "lineno", 0))
        if isinstance(e, ast.Name):
            w.write(self.name(e, scope))
        elif isinstance(e, ast.Constant):
            w.write(self.constant(e))
        elif isinstance(e, ast.Tuple):
            w.write("(")
            for k, item in enumerate(e.elts):
                if k:
                    w.write(", ")
                self.expr(item, w, scope)
            w.write(",)" if len(e.elts) == 1 else ")")
        elif isinstance(e, ast.Call):
            self.call(e, w, scope)
        elif isinstance(e, ast.Attribute):
            resolved = self._resolve(e.value) if not (isinstance(e.value, ast.Name) and e.value.id in scope) else _MISSING
            if isinstance(resolved, TypeExpr):
                w.write(e.attr)  # Tree.Nil: a constructor without fields
            else:
                self.expr(e.value, w, scope)
                w.write(f".{e.attr}")
        elif isinstance(e, ast.Subscript):
            index = e.slice
            if not (isinstance(index, ast.Constant) and isinstance(index.value, int) and index.value >= 0):
                raise self.error(e, "a tuple's field is read with a constant index (t[0]); tensors are indexed by "
                                    "operators (pj.take, pj.slice, ...)")
            self.expr(e.value, w, scope)
            w.write(f".{index.value}")
        elif isinstance(e, ast.BinOp):
            op = _BINARY.get(type(e.op))
            if not op:
                raise self.error(e, f"the operator {type(e.op).__name__} has no pejit operator")
            self.op_call(op, [e.left, e.right], [], w, scope)
        elif isinstance(e, ast.UnaryOp):
            if isinstance(e.op, ast.UAdd):
                self.expr(e.operand, w, scope)
            elif isinstance(e.op, ast.USub) and isinstance(e.operand, ast.Constant):
                w.write("-" + self.constant(e.operand))
            else:
                op = {ast.USub: "neg", ast.Not: "logical_not"}.get(type(e.op))
                if not op:
                    raise self.error(e, "~ has no pejit operator")
                self.op_call(op, [e.operand], [], w, scope)
        elif isinstance(e, ast.Compare):
            if len(e.ops) != 1:
                raise self.error(e, "one comparison at a time (a < b < c: write pj.logical_and of two)")
            op = _COMPARE.get(type(e.ops[0]))
            if not op:
                raise self.error(e, "is/in have no pejit operator")
            self.op_call(op, [e.left, e.comparators[0]], [], w, scope)
        elif isinstance(e, ast.BoolOp):
            op = "logical_and" if isinstance(e.op, ast.And) else "logical_or"
            for _ in e.values[1:]:
                w.write(f"{op}(")
            self.expr(e.values[0], w, scope)
            for v in e.values[1:]:
                w.write(", ")
                self.expr(v, w, scope)
                w.write(")")
        elif isinstance(e, ast.IfExp):
            w.write("if (")
            self.expr(e.test, w, scope)
            w.write(") { ")
            self.expr(e.body, w, scope)
            w.write(" } else { ")
            self.expr(e.orelse, w, scope)
            w.write(" }")
        elif isinstance(e, ast.Lambda):
            raise self.error(e, "a lambda's parameters have no types: write a nested def with annotations")
        else:
            raise self.error(e, f"a {type(e).__name__} expression is not read")

    def name(self, e, scope):
        n = e.id
        if n in scope:
            return f"%{n}"
        if n in self.program._functions or isinstance(self.lookup(n), Definition):
            return f"@{n}"
        if self.is_constructor(n):
            return n
        if n in PRELUDE_FUNCTIONS:
            return f"@{n}"
        raise self.error(e, f"{n} is not a local, a function of the program or the prelude, or a constructor")

    def constant(self, e):
        v = e.value
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                raise self.error(e, "an infinite or NaN constant: compute it (pj.div(1.0, 0.0))")
            return f"{v!r}f32"
        if v is None:
            return "None"  # the prelude's Option constructor
        raise self.error(e, f"a {type(v).__name__} constant is not a pejit value")

    def is_ops(self, node):
        base = self._resolve(node)
        return base is ops or base is sys.modules[__name__]

    def call(self, e, w, scope):
        f = e.func
        if isinstance(f, ast.Attribute) and not (isinstance(f.value, ast.Name) and f.value.id in scope):
            if self.is_ops(f.value):
                self.op_call(f.attr, e.args, e.keywords, w, scope)
                return
            if isinstance(self._resolve(f.value), TypeExpr):
                self.constructor_call(f.attr, e, w, scope)
                return
        if e.keywords:
            raise self.error(e, "keyword arguments are operators' attributes (pj.name(x, attr=value))")
        if isinstance(f, ast.Name) and f.id not in scope and self.is_constructor(f.id):
            self.constructor_call(f.id, e, w, scope)
            return
        self.expr(f, w, scope)
        self.arguments(e.args, w, scope)

    def constructor_call(self, name, e, w, scope):
        if e.keywords:
            raise self.error(e, "constructor fields are given by position")
        w.write(name)
        if e.args:
            self.arguments(e.args, w, scope)

    def arguments(self, args, w, scope):
        w.write("(")
        for k, a in enumerate(args):
            if isinstance(a, ast.Starred):
                raise self.error(a, "*args are not read")
            if k:
                w.write(", ")
            self.expr(a, w, scope)
        w.write(")")

    def op_call(self, op, args, keywords, w, scope):
        w.write(f"{op}(")
        for k, a in enumerate(args):
            if k:
                w.write(", ")
            self.expr(a, w, scope)
        for k, kw in enumerate(keywords):
            if kw.arg is None:
                raise self.error(kw, "**kwargs are not read")
            w.write((", " if args or k else "") + f"{kw.arg}={self.attribute(kw.value)}")
        w.write(")")

    def attribute(self, node):
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return "true" if node.value else "false"
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return repr(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            return "-" + self.attribute(node.operand)
        if isinstance(node, (ast.List, ast.Tuple)):
            return "[" + ", ".join(self.attribute(e) for e in node.elts) + "]"
        value = self._resolve(node)
        if isinstance(value, TypeExpr) and value.text in _DTYPES:
            return value.text
        if isinstance(node, ast.Name) and node.id in _DTYPES:
            return node.id
        raise self.error(node, "an attribute is a number, True/False, a list of ints or a dtype")


class _Missing:
    pass


_MISSING = _Missing()


def _is_docstring(s):
    return isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)


def _terminal(stmts):
    """Whether a statement list always ends in a return."""
    stmts = [s for s in stmts if not isinstance(s, ast.Pass)]
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, ast.Return):
        return True
    if isinstance(last, ast.If):
        return _terminal(last.body) and bool(last.orelse) and _terminal(last.orelse)
    if isinstance(last, ast.Match):
        return all(_terminal(c.body) for c in last.cases)
    return False
