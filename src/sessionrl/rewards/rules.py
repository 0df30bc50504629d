"""The rule file: YAML rules with CEL conditions and values, compiled once per rule-set into reward terms.

A rule is evaluated in one scope (`for_each`: every tool call, LLM call or feedback item, or the session
once). When its `when` expression is true, its `value` expression is the reward, attributed to the call
(or, for feedback, to what the feedback is anchored to) and, with `discount: true`, multiplied by
exp(-λ·Δt).

Python terms are switched on under `terms:` with their layer: the built-ins and those given to the engine
by name, or any other importable one as `name: {layer: ..., function: package.module:function}`.

Loading checks everything it can before any session is scored: the YAML shape (unknown fields, missing
values), that every expression compiles, that it only names variables of its scope and fields of their
views (`sessionrl.rewards.cel_reads`), that on a typical sample it yields a boolean (`when`) or a number
(`value`), and that every Python term is known or imports and passes `check_reward_term`. Each problem is
a `RuleFileError` naming the rule. The rule-set's version is its name and the hash of its file and penalty
table (`default@3f9c...`); the code of Python terms is not part of it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import cel
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sessionrl.errors import SessionRLError
from sessionrl.rewards.catalog import FUNCTION_PATH, TERM_NAME, import_term
from sessionrl.rewards.cel_reads import Reads, expression_reads, merge_reads
from sessionrl.rewards.checker import TermCheckError
from sessionrl.rewards.judge.table import (
    PenaltyTable,
    PenaltyTableError,
    default_table_path,
    load_penalty_table,
)
from sessionrl.rewards.layers import DEFAULT_WEIGHTS, FIVE_LAYERS, LAYERS, Scheme, TermKind
from sessionrl.rewards.terms import (
    BUILTIN_TERMS,
    Params,
    PythonTerm,
    ScoringContext,
    Term,
    TermResult,
    add_steps,
    anchor_steps,
    discount,
    scenario_key,
)
from sessionrl.rewards.views import (
    SCOPE_VARIABLES,
    Scope,
    feedback_view,
    llm_call_view,
    sample_variables,
    session_view,
    tool_call_view,
)
from sessionrl.session.model import Session


class RuleFileError(SessionRLError):
    """A rule file was rejected; `rule` names the rule at fault (None when the problem is file-wide)."""

    def __init__(self, source: str, problem: str, rule: str | None = None) -> None:
        where = f"rule {rule!r}: " if rule is not None else ""
        super().__init__(f"{source}: {where}{problem}")
        self.source = source
        self.rule = rule
        self.problem = problem


class RuleEvalError(SessionRLError):
    """A rule failed on a real session (the sample check at load time could not foresee it)."""


def _known_layer(v: str) -> str:
    if v not in FIVE_LAYERS:
        raise ValueError(f"unknown layer {v!r}; use one of {', '.join(FIVE_LAYERS)}")
    return v


Layer = Annotated[str, AfterValidator(_known_layer)]


class RuleSpec(BaseModel):
    """One rule as written in the file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Unique snake_case name.")
    description: str = ""
    for_each: Scope = Field(description="tool_call, llm_call, feedback or session.")
    when: str = Field(default="true", description="CEL condition; the rule fires where it is true.")
    value: str = Field(description="CEL expression (or a number): the reward when the rule fires.")
    layer: Layer = Field(description="Five-layer layer: completion, efficiency, risk, experience, long_term.")
    discount: bool = Field(default=False, description="Multiply by exp(-λ·Δt) (feedback rules only).")

    @field_validator("when", "value", mode="before")
    @classmethod
    def _number_as_expression(cls, v: Any) -> Any:
        return str(v).lower() if isinstance(v, bool) else str(v) if isinstance(v, int | float) else v

    @model_validator(mode="after")
    def _discount_needs_feedback(self) -> RuleSpec:
        if self.discount and self.for_each is not Scope.FEEDBACK:
            raise ValueError("discount applies to feedback rules only (for_each: feedback)")
        return self


class TermSpec(BaseModel):
    """A Python term switched on in the file: a known one by its key, or one imported from `function`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layer: Layer
    function: str | None = Field(
        default=None,
        pattern=FUNCTION_PATH.pattern,
        description="`package.module:function` to import the term from; the key names it.",
    )


class RuleFile(Params):
    """The whole rule file."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str = ""
    scheme: Scheme = Scheme.FIVE_LAYER
    layer_weights: dict[str, float] = Field(default_factory=dict, description="Overrides of the defaults.")
    normalise: bool = Field(default=True, description="Standardise each layer with its running stats.")
    clip: float = Field(default=5.0, gt=0, description="Bound of a standardised layer value.")
    penalties: str | None = Field(default=None, description="Penalty table, relative to this file.")
    terms: dict[str, TermSpec] = Field(default_factory=dict, description="Python terms to switch on.")
    rules: tuple[RuleSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> RuleFile:
        misnamed = sorted(n for n in self.terms if not TERM_NAME.fullmatch(n))
        if misnamed:
            raise ValueError(f"term names must be snake_case, got {misnamed}")
        bad = set(self.layer_weights) - set(LAYERS[self.scheme])
        if bad:
            raise ValueError(f"layer_weights names {sorted(bad)}, not layers of {self.scheme}")
        names = [r.name for r in self.rules] + list(self.terms)
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"names used twice: {dupes}")
        return self

    @property
    def weights(self) -> dict[str, float]:
        """Weight of every layer of the scheme: defaults overridden by `layer_weights`."""
        return DEFAULT_WEIGHTS[self.scheme] | self.layer_weights


@dataclass(frozen=True)
class RuleSet:
    """A compiled rule file: its settings, its terms in order, its penalty table and its version."""

    file: RuleFile
    version: str
    terms: tuple[Term, ...]
    penalties: PenaltyTable
    penalties_path: Path

    @property
    def name(self) -> str:
        return self.file.name


Needs = Reads
"""Variables a scope's rules read, each with the view fields read (None: the whole value)."""


@dataclass(frozen=True)
class RuleTerm:
    """A compiled rule, callable as a term. `needs` are the variables its scope's rules read."""

    spec: RuleSpec
    when: cel.Program
    value: cel.Program
    needs: Needs

    def __call__(self, session: Session, ctx: ScoringContext) -> TermResult:
        """The rule over every item of its scope. On feedback, the values of one type on one anchor from
        several sources are combined by the file's `aggregate` before they add up (one per group)."""
        fired, seen = list[tuple[str, Any, float]](), 0
        for key, item in _items(self.spec.for_each, session):
            seen += 1
            variables = _variables(self.spec.for_each, self.needs, session, item, key, ctx)
            if not self._fires(variables, session, key):
                continue
            value = self._value(variables, session, key)
            if self.spec.discount:
                value *= discount(item, ctx.params.discount_per_s)
            fired.append((key, item, value))
        total, steps, hits = 0.0, dict[str, float](), list[str]()
        if self.spec.for_each is Scope.FEEDBACK:
            for group in ctx.params.combine((item, value) for _, item, value in fired):
                total += group.value
                hits.append(group.note)
                add_steps(steps, anchor_steps(session, group.item, group.value))
        else:
            for key, _, value in fired:
                total += value
                hits.append(f"{key} {value:+.3g}")
                if self.spec.for_each is not Scope.SESSION:
                    add_steps(steps, {key: value})
        explanation = f"fired on {len(fired)}/{seen} {self.spec.for_each}"
        if hits:
            explanation += ": " + ", ".join(hits[:4]) + (f", +{len(hits) - 4} more" if len(hits) > 4 else "")
        return TermResult(total, steps, explanation)

    def _fires(self, variables: cel.Context, session: Session, key: str) -> bool:
        result = self._run(self.when, variables, session, key, "when")
        if not isinstance(result, bool):
            raise RuleEvalError(f"rule {self.spec.name!r}: when gave {result!r}, not a boolean")
        return result

    def _value(self, variables: cel.Context, session: Session, key: str) -> float:
        result = self._run(self.value, variables, session, key, "value")
        if isinstance(result, bool) or not isinstance(result, int | float) or not math.isfinite(result):
            raise RuleEvalError(
                f"rule {self.spec.name!r} on {key!r}: value gave {result!r}, not a finite number"
            )
        return float(result)

    def _run(
        self, program: cel.Program, variables: cel.Context, session: Session, key: str, part: str
    ) -> Any:
        try:
            return program.execute(variables)
        except Exception as exc:  # the CEL runtime raises plain Python errors of several types
            raise RuleEvalError(
                f"rule {self.spec.name!r}: {part} failed on {key!r} of session {session.session_id!r}: {exc}"
            ) from exc


def _items(scope: Scope, session: Session) -> Iterator[tuple[str, Any]]:
    """The (key, item) pairs a rule of `scope` runs over."""
    if scope is Scope.TOOL_CALL:
        yield from ((c.call_id, c) for c in session.tool_calls)
    elif scope is Scope.LLM_CALL:
        yield from ((c.call_id, c) for c in session.llm_calls)
    elif scope is Scope.FEEDBACK:
        yield from ((f.feedback_id, f) for f in session.feedback)
    else:
        yield session.session_id, session


def _variables(
    scope: Scope, needs: Needs, session: Session, item: Any, key: str, ctx: ScoringContext
) -> cel.Context:
    """The CEL variables of one item, built once per scoring and shared by every rule of the scope.

    Views carry only the fields the scope's rules read (converting values into CEL is the costly part).
    The memo belongs to one session: a context handed a different session starts it afresh.
    """
    if ctx.memo.get("session") is not session:
        ctx.memo.clear()
        ctx.memo["session"] = session
    memo_key = ("cel", scope, key)
    cached = ctx.memo.get(memo_key)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    values: dict[str, Any] = {}
    for name, fields in needs.items():
        value = _variable(name, scope, session, item, ctx)
        if fields is not None and isinstance(value, dict):  # a view: only the fields the rules read
            value = {f: value[f] for f in fields}
        values[name] = value
    context = cel.Context(values)
    ctx.memo[memo_key] = context
    return context


def _variable(name: str, scope: Scope, session: Session, item: Any, ctx: ScoringContext) -> Any:
    """The full value of one scope variable for one item."""
    if name == "session":
        if "session_view" not in ctx.memo:
            ctx.memo["session_view"] = session_view(session)
        return ctx.memo["session_view"]
    if name == "call":
        return tool_call_view(item) if scope is Scope.TOOL_CALL else llm_call_view(item)
    if name == "feedback":
        return feedback_view(item)
    if name == "weight":
        return ctx.params.tool_weight(item.tool)
    if name == "budget_ms":
        return ctx.params.latency_budget(item.tool)
    return ctx.best_steps.get(scenario_key(session), 0)  # best_steps


DEFAULT_RULES = "default_rules.yaml"


def default_rules_path() -> Path:
    """The rule file shipped with sessionrl."""
    return Path(str(resources.files("sessionrl.rewards").joinpath(DEFAULT_RULES)))


def load_rules(path: Path | None = None) -> RuleSet:
    """Read and compile a rule file (the shipped one when `path` is None)."""
    path = path or default_rules_path()
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise RuleFileError(str(path), f"cannot read the file: {exc}") from exc
    return compile_rules(text, str(path), path.parent)


def compile_rules(
    text: bytes, source: str, base: Path, terms: Mapping[str, PythonTerm] = BUILTIN_TERMS
) -> RuleSet:
    """Validate and compile a rule file's text; `base` is the folder a relative `penalties` path starts in.

    `terms` are the Python terms the file may switch on by name (see `sessionrl.rewards.catalog`).
    """
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RuleFileError(source, f"not valid YAML: {exc}") from exc
    file = _validate(raw, source)
    penalties_path = base / file.penalties if file.penalties else default_table_path()
    try:
        penalties = load_penalty_table(penalties_path)
    except (OSError, PenaltyTableError) as exc:
        raise RuleFileError(source, f"penalties: {exc}") from exc
    compiled = (*_compile_rules(file, source), *_python_terms(file, source, terms))
    digest = hashlib.sha256(text + b"\0" + penalties.digest.encode()).hexdigest()[:12]
    return RuleSet(file, f"{file.name}@{digest}", compiled, penalties, penalties_path)


def _validate(raw: Any, source: str) -> RuleFile:
    """The file as a `RuleFile`; the first problem is reported with the rule it belongs to."""
    if not isinstance(raw, dict):
        raise RuleFileError(source, "the file must be a mapping with at least `name` and `rules`")
    try:
        return RuleFile.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc, rule = list(error["loc"]), None
        if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
            entry = raw["rules"][loc[1]]
            named = isinstance(entry, dict) and isinstance(entry.get("name"), str)
            rule, loc = (entry["name"] if named else f"#{loc[1] + 1}"), loc[2:]
        field = ".".join(str(p) for p in loc) or ("rule" if rule else "file")
        raise RuleFileError(source, f"{field}: {_describe(error)}", rule) from exc


def _describe(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown field"
    if error["type"] == "missing":
        return "missing (it is required)"
    return str(error["msg"]).removeprefix("Value error, ")


def _compile_rules(file: RuleFile, source: str) -> tuple[Term, ...]:
    """Every rule compiled and checked, in file order."""
    compiled = []
    for spec in file.rules:
        when, value = _compile(spec, "when", source), _compile(spec, "value", source)
        parts = {"when": expression_reads(when), "value": expression_reads(value)}
        reads = merge_reads(parts["when"], parts["value"])
        unknown = set(reads) - SCOPE_VARIABLES[spec.for_each]
        if unknown:
            known = ", ".join(sorted(SCOPE_VARIABLES[spec.for_each]))
            problem = (
                f"unknown variable(s) {', '.join(sorted(unknown))}; scope {spec.for_each} defines {known}"
            )
            raise RuleFileError(source, problem, spec.name)
        for part, part_reads in parts.items():
            _check_fields(spec, part, part_reads, source)
        _check_on_sample(spec, when, value, source)
        compiled.append((spec, when, value, reads))
    needs: dict[Scope, Needs] = {}
    for spec, _, _, reads in compiled:
        needs[spec.for_each] = merge_reads(needs.get(spec.for_each, {}), reads)
    return tuple(
        Term(spec.name, RuleTerm(spec, when, value, needs[spec.for_each]), TermKind.RULE, spec.layer)
        for spec, when, value, _ in compiled
    )


def _python_terms(file: RuleFile, source: str, known: Mapping[str, PythonTerm]) -> tuple[Term, ...]:
    """The Python terms the file switches on, in file order: known ones by name, others imported."""
    terms = []
    for name, spec in file.terms.items():
        if spec.function is None and name not in known:
            problem = (
                f"terms: unknown term {name!r}; known terms are {', '.join(sorted(known))} "
                "(give your own to RewardEngine(terms=...), or import one with `function: module:name`)"
            )
            raise RuleFileError(source, problem)
        if spec.function is not None and name in known:
            problem = f"terms: {name!r} is already a known term; import yours under another name"
            raise RuleFileError(source, problem)
        try:
            python = known[name] if spec.function is None else import_term(spec.function, name)
        except TermCheckError as exc:
            raise RuleFileError(source, f"terms: {exc}") from exc
        terms.append(Term(name, python.fn, python.kind, spec.layer))
    return tuple(terms)


def _compile(spec: RuleSpec, part: str, source: str) -> cel.Program:
    expression = getattr(spec, part)
    try:
        return cel.compile(expression)
    except ValueError as exc:
        raise RuleFileError(source, f"{part}: CEL does not compile: {exc}", spec.name) from exc


def _check_fields(spec: RuleSpec, part: str, reads: Reads, source: str) -> None:
    """Fields read from `call`, `feedback` and `session` must be fields of their view (typos caught here)."""
    views = sample_variables(spec.for_each)
    for variable, fields in sorted(reads.items()):
        view = views.get(variable)
        if not isinstance(view, dict) or fields is None:
            continue
        for name in sorted(fields - view.keys()):
            known = ", ".join(sorted(view))
            raise RuleFileError(
                source, f"{part}: {variable} has no field {name!r} (it has {known})", spec.name
            )


def _check_on_sample(spec: RuleSpec, when: cel.Program, value: cel.Program, source: str) -> None:
    """Run both expressions on a typical item of the scope: type mistakes show up here, not mid-scoring.

    A missing map key (`KeyError`) is tolerated: the sample cannot hold every key a real item may carry.
    """
    variables = cel.Context(sample_variables(spec.for_each))
    for part, program in (("when", when), ("value", value)):
        try:
            result = program.execute(variables)
        except (KeyError, ZeroDivisionError):
            continue
        except Exception as exc:  # the CEL runtime raises TypeError, RuntimeError, ValueError, ...
            raise RuleFileError(
                source, f"{part} fails on a sample {spec.for_each}: {exc}", spec.name
            ) from exc
        if part == "when" and not isinstance(result, bool):
            raise RuleFileError(source, f"when must give a boolean, gave {result!r}", spec.name)
        if part == "value" and (isinstance(result, bool) or not isinstance(result, int | float)):
            raise RuleFileError(source, f"value must give a number, gave {result!r}", spec.name)
