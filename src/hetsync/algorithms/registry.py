"""The mode registry: the one place that knows, per synchronisation mode, what it needs.

A mode is one file (a :class:`~hetsync.algorithms.base.Mode` subclass, its options dataclass and
its server rule, if any) that ends with one ``register(ModeSpec(...))``. Everything else — the
command line, the worker's assembly, ``hetsync.wrap``, the launcher, the bench, the summaries —
asks the registry instead of comparing the mode's name to a string. Adding a mode (see
docs/design.md, "Adding a mode"):

    @dataclass
    class EveryKOptions:
        period: int = field(default=8, metadata={"flags": ("--period",), "help": "K"})

    class EveryK(Mode):
        ...

    register(ModeSpec("every-k", EveryK, "average the models every K steps",
                      options=EveryKOptions))

A module that registers modes outside hetsync is named with ``--plugin MODULE``: every process
of the run imports it before it reads the mode.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable

from hetsync.options import as_python_numbers, check_types
from hetsync.services import RunService

_BUILTIN_MODULES = ("hetsync.algorithms.sequential", "hetsync.algorithms.sync",
                    "hetsync.algorithms.lookahead",
                    "hetsync.algorithms.esync", "hetsync.algorithms.diloco",
                    "hetsync.algorithms.async_ps", "hetsync.algorithms.async_local_sgd",
                    "hetsync.algorithms.fedbuff",
                    "hetsync.algorithms.eager", "hetsync.algorithms.selsync",
                    "hetsync.algorithms.gradient_dropping", "hetsync.algorithms.dgc",
                    "hetsync.algorithms.dgs", "hetsync.algorithms.baselines")


@dataclass(frozen=True)
class ModeSpec:
    """What the rest of hetsync needs to know about one mode.

    Attributes:
        name: the mode's name (``-m NAME``).
        worker: the :class:`~hetsync.algorithms.base.Mode` subclass every worker runs.
        summary: one line for ``--help``, the README and the bench's notes.
        options: the mode's own options, a dataclass whose fields carry ``flags`` and ``help``
            in their metadata (as :class:`hetsync.config.Config`'s) and that may have a
            ``validate()`` raising :class:`hetsync.options.ConfigError`; ``None``: no options.
        server_rule: ``(weights, lr, options, layout, workers) -> ServerRule`` for the
            parameter server's asynchronous requests (``layout``: the
            :class:`~hetsync.compression.Layout` of the flat weights' layers; ``workers``: how
            many push to it); ``None``: the server (if any) only sums.
        push_extra: numbers a push carries after the model's (the server refuses any other
            length), e.g. a worker's local steps and step time.
        sum_length: ``(model numel, BatchNorm statistics numel, options) -> int``: the longest
            sum a worker sends over ``--collective ps`` (the server refuses longer ones; the
            loop's agreement, which may ride at its end, is added); ``None``: the model, its
            statistics and two counts.
        service: a process the workers talk to besides one another
            (:class:`hetsync.services.RunService`).
        parameter_server: the run needs a parameter-server rank whatever ``--collective`` says.
        collective: the mode aggregates through ``--collective`` (else through its own
            transport, and ``--collective`` must stay ``native``).
        lr_scaling: how the bench scales the base rate with P workers: ``"workers"`` (× P: one
            averaged gradient of P batches per step) or ``"base"``.
        lr_note: how the rate is used, for the bench's table (e.g. "local rate, outer
            {global_lr:g}": `rate_note` fills in `defaults`, or the rate a run gives).
        defaults: the mode's own values of the shared options it leaves None
            (`algorithms/outer.py`'s: its global rate, outer momentum, weighting), written once
            here: its workers and server rule read them (`global_update`), `summary` and
            `lr_note` name them as ``{global_lr:g}``, and `--help` shows them.
        max_workers: the most workers the mode runs on (sequential SGD: 1).
        min_workers: the fewest (PyTorch's DDP needs a process group: 2).
        baseline: a scheme of PyTorch's own, run by the bench beside hetsync's.
        counts_samples: its sums count samples where the workers' batches differ
            (`--balanced-batches`: `CommContext.sample_weight`); elsewhere they would count
            workers, so such a run is refused.
        resolve: ``options -> name`` of the mode the run really is, for a mode whose options
            select another (ESync's ``-m async -dcasgd 1`` is ``dcasgd``).
        non_iid_options: option values the mode takes on a non-IID partition (``class``,
            ``dirichlet``) where the command line does not give them.
    """

    name: str
    worker: type
    summary: str
    options: type | None = None
    server_rule: Callable[..., Any] | None = None
    service: RunService | None = None
    parameter_server: bool = False
    collective: bool = True
    push_extra: int = 0
    sum_length: Callable[[int, int, Any], int] | None = None
    lr_scaling: str = "base"
    lr_note: str = "base"
    max_workers: int | None = None
    min_workers: int = 1
    baseline: bool = False
    counts_samples: bool = False
    non_iid_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    resolve: Callable[[Any], str] | None = None
    defaults: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "summary", self.summary.format(**self.defaults))
        if self.lr_scaling not in ("base", "workers"):
            raise ValueError(f"mode {self.name!r}: lr_scaling must be 'base' or 'workers', "
                             f"got {self.lr_scaling!r}")
        if self.options is not None and not dataclasses.is_dataclass(self.options):
            raise ValueError(f"mode {self.name!r}: options must be a dataclass, got "
                             f"{self.options!r}")

    def make_options(self, values: dict[str, Any] | None = None):
        """The typed options from ``values`` (field name -> value), defaults for the rest,
        type-checked and validated. ValueError naming a value that is not one of the mode's
        options; ConfigError (a ValueError) naming the flag of a bad value."""
        known = [f.name for f in self.option_fields()]
        unknown = sorted(set(values or {}) - set(known))
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))} is not an option of mode "
                             f"{self.name}; its options: {', '.join(known) or 'none'}")
        if self.options is None:
            return None
        options = self.options(**as_python_numbers(self.options, values or {}))
        check_types(options)
        if hasattr(options, "validate"):
            options.validate()
        return options

    def option_fields(self) -> tuple[dataclasses.Field, ...]:
        return dataclasses.fields(self.options) if self.options is not None else ()

    def rate_note(self, global_lr: float | None = None) -> str:
        """`lr_note` with the mode's defaults, or the global rate a run gives."""
        given = {} if global_lr is None else {"global_lr": global_lr}
        return self.lr_note.format(**{**self.defaults, **given})

    def run_mode(self, options) -> str:
        """The name this run is recorded under (``resolve``, else the mode's own)."""
        return self.resolve(options) if self.resolve is not None else self.name

    def longest_sum(self, model_numel: int, stats_numel: int, options) -> int:
        """The longest sum this mode's workers send to a parameter server: the mode's own,
        then the loop's agreement, which may ride at its end (`Mode.sum_with_proposal`)."""
        from hetsync.algorithms.base import PROPOSAL_LENGTH

        if self.sum_length is not None:
            return self.sum_length(model_numel, stats_numel, options) + PROPOSAL_LENGTH
        return model_numel + stats_numel + 2 + PROPOSAL_LENGTH

    def needs_parameter_server(self, collective: str) -> bool:
        return self.parameter_server or (self.collective and collective == "ps")

    @property
    def asynchronous(self) -> bool:
        """No common round: each worker talks only to the parameter server and agrees with
        the others through the store (so they may checkpoint apart, and lose one another)."""
        from hetsync.algorithms.base import ControlPath

        return self.worker.control is ControlPath.STORE


_REGISTRY: dict[str, ModeSpec] = {}
_loaded = False


def register(spec: ModeSpec) -> ModeSpec:
    """Add ``spec``; ValueError if its name is taken or one of its option flags is claimed by
    another options class. (That a flag is not one of every run's is the command line's to
    check: `hetsync.command_line.check_option_flags`.)"""
    old = _REGISTRY.get(spec.name)
    if old is not None and qualname(old.worker) != qualname(spec.worker):
        raise ValueError(f"mode {spec.name!r} is already registered "
                         f"(by {_REGISTRY[spec.name].worker.__module__})")
    claimed = {flag: (s, option_key(s.options, f)) for s in _REGISTRY.values()
               if s.name != spec.name for f in s.option_fields()
               for flag in f.metadata["flags"]}
    for f in spec.option_fields():
        for flag in f.metadata["flags"]:
            other, key = claimed.get(flag, (None, None))
            if other is not None and key != option_key(spec.options, f):
                raise ValueError(f"mode {spec.name!r}: option flag {flag} is already an option "
                                 f"of mode {other.name!r}")
    _REGISTRY[spec.name] = spec
    return spec


def option_key(options: type, f: dataclasses.Field) -> tuple[str, str]:
    """An option's identity: the options class that declares field `f` (a base class that
    several modes' options inherit, as `-gl` from `outer.OuterOptions`), and its name."""
    owner = next(c for c in reversed(options.__mro__)
                 if f.name in getattr(c, "__dataclass_fields__", {}))
    return qualname(owner), f.name


def qualname(cls: type) -> str:
    """A class's identity that survives its module being imported again."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _load_builtins() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in _BUILTIN_MODULES:
            importlib.import_module(module)


def get(name: str) -> ModeSpec:
    """The spec of mode ``name``; ValueError naming it and the valid ones."""
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r}; expected one of {', '.join(names())}") \
            from None


def specs() -> tuple[ModeSpec, ...]:
    """Every registered spec: hetsync's own in the order of their modules, then the others in
    the order they were registered."""
    _load_builtins()

    def order(spec: ModeSpec) -> int:
        module = spec.worker.__module__
        return _BUILTIN_MODULES.index(module) if module in _BUILTIN_MODULES \
            else len(_BUILTIN_MODULES)

    return tuple(sorted(_REGISTRY.values(), key=order))


def names(*, baseline: bool | None = None, counts_samples: bool | None = None,
          rounds_all_or_none: bool | None = None) -> tuple[str, ...]:
    """Registered mode names, in the order of `specs` (``baseline``, ``counts_samples``,
    and the worker's `Mode.rounds_all_or_none` filter)."""
    return tuple(s.name for s in specs() if (baseline is None or s.baseline == baseline)
                 and (counts_samples is None or s.counts_samples == counts_samples)
                 and (rounds_all_or_none is None
                      or s.worker.rounds_all_or_none == rounds_all_or_none))


def options_doc(indent: str = "") -> str:
    """hetsync's own modes (not PyTorch's baselines) with their options, for docstrings:
    one line per mode, then one per option: ``name = default: help``."""
    lines = []
    for spec in specs():
        if spec.baseline:
            continue
        lines.append(f"{indent}{spec.name}: {spec.summary}")
        for f in spec.option_fields():
            default = f.default if f.default is not dataclasses.MISSING else "(required)"
            lines.append(f"{indent}    {f.name} = {default!r}: {f.metadata.get('help', '')}")
    return "\n".join(lines) + "\n"


def import_plugins(modules) -> None:
    """Import each module named in ``modules`` (they register modes); ValueError naming one
    that cannot be imported."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - any failure of a user's module, named
            raise ValueError(f"plugin module {module!r} could not be imported: "
                             f"{type(err).__name__}: {err}") from None


def build_server_rule(name: str, weights, lr: float, options=None, layout=None,
                      workers: int = 1):
    """The parameter server's rule for mode `name` (its `server_rule`) over the flat `weights`
    whose layers `layout` gives (None: one layer), for `workers` workers; ValueError naming a
    mode that has none."""
    from hetsync.compression import Layout

    spec = get(name)
    if spec.server_rule is None:
        with_rule = [s.name for s in specs() if s.server_rule is not None]
        raise ValueError(f"mode {name!r} has no parameter-server rule; expected one of "
                         f"{', '.join(with_rule)}")
    return spec.server_rule(weights, lr, options if options is not None else spec.make_options(),
                            layout if layout is not None else Layout((weights.numel(),)),
                            workers)
