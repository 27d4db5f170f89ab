"""The option machinery below the modes: how a dataclass field becomes a command-line flag
(its metadata's `flags` and `help`; its parser from its type, `X | None` accepting `none`, or
one named in its metadata), how a value from a config file or the Python API is checked
against the field's type, and the one-line `ConfigError` naming the flag, the value and what
would be valid. `hetsync.config.Config` and every mode's options dataclass are built on it;
`hetsync.command_line` gathers them into the command line."""

from __future__ import annotations

import argparse
import dataclasses
import math
import numbers
import typing
from typing import Any


class ConfigError(ValueError):
    """A user-facing configuration mistake: the message names the flag, value and valid range."""


def invalid_option(options, name: str, valid: str) -> ConfigError:
    """The error for a bad value of field `name` of `options` (a mode's options dataclass, or
    a Config): its flags, its value, what would be valid."""
    f = next(f for f in dataclasses.fields(options) if f.name == name)
    return ConfigError(f"{'/'.join(f.metadata['flags'])}: invalid value "
                       f"{getattr(options, name)!r}; expected {valid}")


def is_a(value: Any, kind: Any) -> bool:
    """Whether `value` is of type `kind` as a field's type says (bool is not a number here)."""
    args = typing.get_args(kind)
    if type(None) in args:
        return value is None or any(is_a(value, a) for a in args if a is not type(None))
    if kind is bool:
        return isinstance(value, bool)
    if kind in (int, float):
        return (isinstance(value, (int, float) if kind is float else int)
                and not isinstance(value, bool))
    if kind is str:
        return isinstance(value, str)
    if typing.get_origin(kind) is tuple:
        return isinstance(value, tuple) and all(is_a(v, args[0]) for v in value)
    return True  # a type no flag gives (options): not checked here


def as_python_numbers(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """`values` for dataclass `cls` with each number given for an int or float field as
    Python's own (a NumPy scalar from a user's sweep, which `check_types` and `config.json`
    would not take); anything else as it is, for `check_types` to judge."""
    hints = typing.get_type_hints(cls)
    out = dict(values)
    for name, value in values.items():
        kinds = set(typing.get_args(hints.get(name))) or {hints.get(name)}
        if isinstance(value, (bool, int, float)):
            continue
        if int in kinds and isinstance(value, numbers.Integral):
            out[name] = int(value)
        elif float in kinds and isinstance(value, numbers.Real):
            out[name] = float(value)
    return out


def _type_name(kind: Any) -> str:
    args = typing.get_args(kind)
    if type(None) in args:
        return " or ".join([_type_name(a) for a in args if a is not type(None)] + ["null"])
    if typing.get_origin(kind) is tuple:
        return f"a list of {_type_name(args[0]).split(' ', 1)[1]}s"
    return {bool: "true or false", int: "an integer", float: "a number",
            str: "a string"}.get(kind, str(kind))


def check_types(obj) -> None:
    """ConfigError naming the first field of dataclass `obj` (a Config, a mode's options)
    whose value is not of the field's type: a config file or the Python API can hold any
    value, the command line only what the field's parser makes."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if f.metadata.get("flags") and not is_a(getattr(obj, f.name), hints[f.name]):
            raise invalid_option(obj, f.name, _type_name(hints[f.name]))


def bounded_int(low: int, high: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected {what} in "
                                             f"{low}..{high}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"invalid value {value}; expected {what} in "
                                             f"{low}..{high}")
        return value
    return parse


def bounded_float(low: float, high: float, what: str):
    """A parser of one number in (low, high]."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and low < value <= high):
            raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected {what} in "
                                             f"({low:g}, {high:g}]")
        return value
    return parse


def parse_target(text: str) -> float:
    """A target of a run's figure of merit (summarize's --targets, plot's --target): a finite
    number > 0; whether it is an accuracy in (0, 1] is checked against the run's metric."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected an accuracy in "
                                         f"(0, 1] or a loss > 0")
    return value


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected 0 or 1, got {text!r}")


def _parse_floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers such as 1,2,4,8, got {text!r}") from None


def float_list(low: float, high: float = math.inf, what: str = "numbers"):
    """A parser of comma-separated `what`, each in (low, high]."""
    def parse(text: str) -> tuple[float, ...]:
        try:
            values = tuple(float(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {what}, got {text!r}") from None
        if not values or any(not (math.isfinite(v) and low < v <= high) for v in values):
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {what} in ({low:g}, {high:g}], got {text!r}")
        return values
    return parse


def _parse_names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def parse_epsilon(text: str) -> float | None:
    """`auto` (None) or a number."""
    if text.strip().lower() == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a number, got {text!r}") from None


def parse_epsilon_fraction(text: str) -> float | None:
    """`auto` (None) or a fraction in (-1, 1): a service's --epsilon (ESync's planning
    margin; ESync's own --epsilon is checked with its options, ESyncOptions.validate)."""
    value = parse_epsilon(text)
    if value is not None and not -1 < value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected auto or a "
                                         f"fraction in (-1, 1)")
    return value


#: bounds of option values that a server checks too: a mode's service (ESync's plan) keeps
#: a record per worker; sleeps and waits overflow past some 1e9 s (a week is already far
#: beyond any use)
MAX_WORKERS = 1024
MAX_WAIT_S = 7 * 24 * 3600.0


def _optional(kind):
    def parse(text: str):
        return None if text.strip().lower() in ("", "none") else kind(text)
    return parse


def parse_delay(text: str) -> tuple[float, bool]:
    """`0.32` (seconds) or `4x` (× the typical step): (value, relative)."""
    relative = text.strip().lower().endswith("x")
    value = float(text.strip()[:-1] if relative else text)
    if not 0 <= value < float("inf"):
        raise ValueError(f"expected a delay >= 0 in seconds or as Nx, got {text!r}")
    return value, relative


#: Parsers named by a field's `parser` metadata (where its type alone does not say).
def _parse_delay(text: str) -> str:
    try:
        parse_delay(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (0.32) or a multiple of the step "
                                         f"(4x), got {text!r}") from None
    return text.strip().lower()


NAMED_PARSERS = {"epsilon": parse_epsilon, "names": _parse_names, "delay": _parse_delay}
_TYPE_PARSERS = {int: int, float: float, str: str, bool: _parse_bool,
                 tuple[float, ...]: _parse_floats, tuple[str, ...]: _parse_names}


def parser_for(f: dataclasses.Field, hints: dict[str, Any]):
    """The command-line parser of dataclass field `f` (`hints`: its class's resolved types):
    its `parser` metadata, else its type; `X | None` accepts `none` too."""
    if "parser" in f.metadata:
        return NAMED_PARSERS[f.metadata["parser"]]
    kind = hints[f.name]
    args = typing.get_args(kind)
    if type(None) in args and len(args) == 2:
        inner = next(a for a in args if a is not type(None))
        return _optional(_TYPE_PARSERS[inner])
    try:
        return _TYPE_PARSERS[kind]
    except KeyError:
        raise TypeError(f"field {f.name!r}: no command-line parser for type {kind}; give "
                        f"metadata['parser'] one of {sorted(NAMED_PARSERS)}") from None
