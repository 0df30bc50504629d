"""What a compiled CEL expression reads: its free variables, and the fields it selects from each.

The variables come from the compiled program (`Program.variables()`, the library's own static analysis).
The library stops there: it lists names bound by comprehension macros (the `t` of
`session.tools.exists(t, ...)`) as if they were variables, and it exposes no syntax tree, so it cannot say
which fields of a variable an expression selects. Both come from the expression's tokens: a small
tokenizer that skips string literals and comments, so text inside quotes is never mistaken for a read.

A variable's reads are the fields selected from it (`call.ok` reads `ok` of `call`), or None when the
expression uses the value whole (`size(call)`, `call["ok"]`, `call.size()`, or a macro variable that
shadows it): a caller that trims values to what is read must then pass the whole value.

>>> program = cel.compile('session.tools.exists(t, t == call.tool) && !call.ok && weight > 1.0')
>>> sorted(program.variables())  # the library's view: `t` is bound by `exists`, not a variable
['call', 'session', 't', 'weight']
>>> reads = expression_reads(program)
>>> {name: sorted(fields) if fields is not None else None for name, fields in sorted(reads.items())}
{'call': ['ok', 'tool'], 'session': ['tools'], 'weight': None}
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import cel

Reads = Mapping[str, frozenset[str] | None]
"""Variables an expression reads, each with the fields it selects (None: the whole value)."""

MACROS = frozenset({"all", "exists", "exists_one", "map", "filter", "bind"})
"""Macros whose first argument names a new variable (`cel.bind(x, init, body)` included)."""

_TOKEN = re.compile(
    r"""
    (?P<skip>\s+|//[^\n]*)
  | (?P<raw>(?:[rR][bB]?|[bB][rR])(?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"[^"\n]*"|'[^'\n]*'))
  | (?P<string>[bB]?(?:\"\"\"(?:\\[\s\S]|[^\\])*?\"\"\"|'''(?:\\[\s\S]|[^\\])*?'''
                     |"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<number>0[xX][0-9a-fA-F]+[uU]?|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[uU]?)
  | (?P<punct>.)
    """,
    re.VERBOSE,
)
LITERAL = "\0"
"""The token a string, bytes or number literal becomes: it can neither be a variable nor a field."""


def tokens(source: str) -> list[str]:
    """The tokens of a CEL expression: identifiers and punctuation as written, literals as `LITERAL`,
    spaces and comments dropped.

    >>> tokens('call.tool == "call.x" // call.y')
    ['call', '.', 'tool', '=', '=', '\\x00']
    """
    out = []
    for match in _TOKEN.finditer(source):
        kind = match.lastgroup
        if kind == "skip":
            continue
        out.append(match.group() if kind in ("ident", "punct") else LITERAL)
    return out


def bound_names(toks: list[str]) -> set[str]:
    """Names that macros bind: the `x` of `.exists(x, ...)`, `.map(x, ...)`, `cel.bind(x, ...)`, ..."""
    return {
        toks[i + 3]
        for i in range(len(toks) - 4)
        if toks[i] == "." and toks[i + 1] in MACROS and toks[i + 2] == "(" and toks[i + 4] == ","
    }


def expression_reads(program: cel.Program) -> dict[str, frozenset[str] | None]:
    """The free variables of a compiled expression, each with the fields it selects (None: whole)."""
    toks = tokens(program.source)
    free = set(program.variables()) - bound_names(toks)
    fields: dict[str, set[str]] = {name: set() for name in free}
    whole: set[str] = set()
    for i, tok in enumerate(toks):
        if tok not in fields or (i > 0 and toks[i - 1] == "."):
            continue  # not a free variable, or a field of something else that has the same name
        field = toks[i + 2] if i + 2 < len(toks) and toks[i + 1] == "." else None
        called = i + 3 < len(toks) and toks[i + 3] == "("
        if field is not None and _is_identifier(field) and not called:
            fields[tok].add(field)
        else:
            whole.add(tok)
    return {name: None if name in whole or not fields[name] else frozenset(fields[name]) for name in free}


def merge_reads(a: Reads, b: Reads) -> dict[str, frozenset[str] | None]:
    """Reads of two expressions together (the whole value wins over fields)."""
    merged = dict(a)
    for name, fields in b.items():
        old = merged.get(name, frozenset())
        merged[name] = None if fields is None or old is None else old | fields
    return merged


def _is_identifier(token: str) -> bool:
    return token[:1].isalpha() or token[:1] == "_"
