"""Typed schemas for what clients send: strict, frozen and closed, with refusals that say what is allowed.

A value is taken only if it already has the field's type ("5" is not a number, 5.0 is not a whole
number, 1 is not true) and lies within the field's bounds. Each refusal names the field, the value as
sent (shortened: it is the client's own input) and what the field takes, e.g. "epochs: 1e+308 is not a
whole number from 1 to 1000". The CLI takes its option ranges from the same bounds, so they are
written once.
"""

from __future__ import annotations

import json
import re
import types
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Self, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, ConfigDict, ModelWrapValidatorHandler, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import InitErrorDetails, PydanticCustomError

from appliance.core.errors import ApplianceError, JobError

SHOWN_CHARS = 60
SHOWN_PROBLEMS = 5
EXPLAINED = "explained"  # the type of a refusal already put in words
SQLITE_MAX_INT = 2**63 - 1  # the largest whole number SQLite holds: a sequence number or id past it is none
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # a dataset's or a model's name
NAME_RULE = "up to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"


@dataclass(frozen=True)
class Bounds:
    """A numeric field's limits; an open end excludes its limit."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False


class Strict(BaseModel):
    """A schema whose refusals name the field, the value and what the field takes."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid", allow_inf_nan=False)
    noun: ClassVar[str] = "this"  # who takes these fields, in messages: "a train job", "the training"

    @model_validator(mode="wrap")
    @classmethod
    def _explained(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        try:
            return handler(data)
        except ValidationError as exc:
            raise ValidationError.from_exception_data(
                cls.__name__, [_details(error, _words(cls, error)) for error in exc.errors()]) from None

    @classmethod
    def parse(cls, values: Any) -> Self:
        """The schema from a client's values (or a stored row); JobError naming what is wrong."""
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise JobError(problems(exc), hint="give each value named the type and range it says, then try again") \
                from None

    def changed(self, **values: Any) -> Self:
        """A copy with these values, checked like a client's (they may come from outside)."""
        return self.parse({**self.model_dump(exclude_unset=True), **values})


def refusal(message: str) -> PydanticCustomError:
    """An error for a validator to raise, already in words."""
    return PydanticCustomError(EXPLAINED, "{message}", {"message": message})


def check_name(name: str, what: str, error: type[ApplianceError]) -> str:
    """The name, if a dataset or a model may have it: it goes into refs (name:3, name@production) and URLs."""
    if not NAME.fullmatch(name):
        raise error(f"{name[:80]!r} is not a usable {what} name", hint=NAME_RULE)
    return name


def problems(exc: ValidationError) -> str:
    """The refusals of a validation, as 'where: what' joined by '; '."""
    found = [f"{'.'.join(str(part) for part in error['loc']) or 'value'}: {error['msg']}" for error in exc.errors()]
    more = f"; and {len(found) - SHOWN_PROBLEMS} more" if len(found) > SHOWN_PROBLEMS else ""
    return "; ".join(found[:SHOWN_PROBLEMS]) + more


def shown(value: Any) -> str:
    """A client's value as they wrote it (JSON), shortened."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 1] + "…"


def bounds(field: FieldInfo) -> Bounds:
    """A field's numeric limits, from its constraints."""
    found: dict[str, Any] = {}
    for constraint in _unwrapped(field)[1]:
        match constraint:
            case annotated_types.Ge(ge=low):
                found.update(low=low, low_open=False)
            case annotated_types.Gt(gt=low):
                found.update(low=low, low_open=True)
            case annotated_types.Le(le=high):
                found.update(high=high, high_open=False)
            case annotated_types.Lt(lt=high):
                found.update(high=high, high_open=True)
    return Bounds(**found)


def bare(field: FieldInfo) -> Any:
    """A field's type without its None (a field that may be left out) and its constraints."""
    return _unwrapped(field)[0]


def _unwrapped(field: FieldInfo) -> tuple[Any, list[Any]]:
    kind, constraints = field.annotation, list(field.metadata)
    if get_origin(kind) in (Union, types.UnionType):
        kind = next(arg for arg in get_args(kind) if arg is not type(None))
    if get_origin(kind) is Annotated:  # an optional field of a constrained type: Name | None
        kind, *extra = get_args(kind)
        constraints += [c for item in extra for c in (item.metadata if isinstance(item, FieldInfo) else [item])]
    return kind, constraints


def allowed(field: FieldInfo) -> str:
    """What a field takes, in words: 'a whole number from 1 to 1000', 'one of "linear", "cosine"'."""
    kind, constraints = _unwrapped(field)
    if get_origin(kind) is Literal:
        return "one of " + ", ".join(json.dumps(choice) for choice in get_args(kind))
    if kind is bool:
        return "true or false"
    if kind in (int, float):
        return ("a whole number" if kind is int else "a number") + _range(bounds(field))
    if kind is str:
        lengths = {type(c): c for c in constraints if isinstance(c, annotated_types.MinLen | annotated_types.MaxLen)}
        low = lengths[annotated_types.MinLen].min_length if annotated_types.MinLen in lengths else 0
        high = lengths[annotated_types.MaxLen].max_length if annotated_types.MaxLen in lengths else None
        return f"text of {low} to {high} characters" if high else "text"
    if isinstance(kind, type) and issubclass(kind, Strict):
        return f"an object of what {kind.noun} takes: {', '.join(kind.model_fields)}"
    return "an object" if get_origin(kind) is dict or kind is dict else str(kind)


def _range(limits: Bounds) -> str:
    low, high = limits.low, limits.high
    if low is not None and high is not None and not limits.low_open and not limits.high_open:
        return f" from {_number(low)} to {_number(high)}"
    ends = ([f"{'above' if limits.low_open else 'at least'} {_number(low)}"] if low is not None else []) + \
           ([f"{'below' if limits.high_open else 'at most'} {_number(high)}"] if high is not None else [])
    return " " + " and ".join(ends) if ends else ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


def _words(model: type[Strict], error: Any) -> str:
    """One refusal of a field of model, in words."""
    if error["type"] == EXPLAINED:
        return error["msg"]
    loc = error["loc"]
    field = model.model_fields.get(loc[0]) if loc and isinstance(loc[0], str) else None
    takes = ", ".join(model.model_fields)
    if error["type"] == "extra_forbidden":
        return f"{model.noun} takes no such parameter; it takes {takes}"
    if field is None:
        return f"{shown(error['input'])} is not an object of what {model.noun} takes: {takes}" if not loc \
            else error["msg"]
    if error["type"] == "missing":
        return f"missing: {model.noun} needs it, {allowed(field)}"
    return f"{shown(error['input'])} is not {allowed(field)}"


def _details(error: Any, message: str) -> InitErrorDetails:
    return InitErrorDetails(type=refusal(message), loc=error["loc"], input=error["input"])
