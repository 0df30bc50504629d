"""The Python terms a rule file may switch on: the built-ins, the user's own, and `module:function` imports.

A term of your own is a function `(session, ctx) -> TermResult` (or a `PythonTerm`, to give its kind).
Hand it to the engine, and switch it on in the rule file with the layer it feeds:

```python
engine = RewardEngine(RewardConfig(rules=Path("rules.yaml")), terms=[refund_accuracy])
```

```yaml
terms:
  refund_accuracy: {layer: completion}
```

A rule file can also import one itself: `late_refund: {layer: risk, function: my_domain.rewards:late_refund}`
(the key names the term). Every user term passes `check_reward_term` before it is used, so a term that
breaks the contract is refused when it is registered, with the checker's advice, not mid-scoring.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping, Sequence

from sessionrl.rewards.checker import TermCheckError, check_reward_term
from sessionrl.rewards.terms import BUILTIN_TERMS, PythonTerm, TermFn

UserTerm = TermFn | PythonTerm
UserTerms = Mapping[str, UserTerm] | Sequence[UserTerm]
"""Terms given to `RewardEngine(terms=...)`: by name, or as functions named by their `__name__`."""

TERM_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
"""What a term's name looks like (as a rule's: snake_case)."""

FUNCTION_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
"""`package.module:attribute`, the way a rule file names a term to import."""


def term_catalog(terms: UserTerms | None = None) -> dict[str, PythonTerm]:
    """The built-in terms and `terms`, each of those checked; raises `TermCheckError` saying what to fix."""
    catalog = dict(BUILTIN_TERMS)
    items = terms.items() if isinstance(terms, Mapping) else ((None, t) for t in terms or ())
    for key, term in items:
        python = as_python_term(term, key)
        if python.name in catalog:
            owner = "a built-in term" if python.name in BUILTIN_TERMS else "given twice"
            raise TermCheckError(f"term name {python.name!r} is {owner}; give your term another name")
        _check(python)
        catalog[python.name] = python
    return catalog


def _check(term: PythonTerm) -> None:
    """`check_reward_term`, its refusal naming the term as it is registered."""
    try:
        check_reward_term(term.fn)
    except TermCheckError as exc:
        raise TermCheckError(f"term {term.name!r} was refused: {exc}") from exc


def as_python_term(term: object, name: str | None = None) -> PythonTerm:
    """`term` (a function or a `PythonTerm`) as a `PythonTerm` called `name` (default: its own name)."""
    if isinstance(term, PythonTerm):
        python = term if name is None or name == term.name else PythonTerm(name, term.fn, term.kind)
    elif callable(term):
        fallback = getattr(term, "__name__", None)
        python = PythonTerm(name or (fallback if isinstance(fallback, str) else ""), term)
    else:
        raise TermCheckError(
            f"{term!r} is not a term; a term is a function (session, ctx) -> TermResult, or a PythonTerm"
        )
    if not TERM_NAME.fullmatch(python.name):
        raise TermCheckError(
            f"a term cannot be called {python.name!r}; name it in snake_case, by passing terms as a "
            "mapping {'my_term': fn} or as PythonTerm('my_term', fn)"
        )
    return python


def import_term(path: str, name: str) -> PythonTerm:
    """The term at `path` (`package.module:attribute`), called `name`, after `check_reward_term`.

    Raises `TermCheckError` when it cannot be imported, is not a term, or breaks the term contract.
    """
    if not FUNCTION_PATH.fullmatch(path):
        raise TermCheckError(f"{path!r} is not `package.module:function`")
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TermCheckError(
            f"cannot import {module_name!r} ({exc}); install it or put it on the Python path"
        ) from exc
    target = getattr(module, attribute, None)
    if target is None:
        raise TermCheckError(f"module {module_name!r} has no {attribute!r}")
    python = as_python_term(target, name)
    _check(python)
    return python
