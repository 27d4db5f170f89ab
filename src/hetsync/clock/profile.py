"""A cluster profile: the devices and links a virtual clock times a run by, as one JSON file.

A profile says, for each device, what a step costs — `step_s` seconds per step whatever its
batch (kernel launches, the optimizer, Python) plus `sample_s` seconds per sample — and what
its link costs (α `latency_s`, β `bandwidth_bps`), with an optional seeded jitter on every
step. `hetsync probe` writes one from a real cluster's measurements; one can also be written by
hand from a device's published throughput (`docs/virtual-clock.md` has an example), as
FedScale and HALoS take theirs. `--profile FILE` (launch, bench, worker) runs on it:

1. each worker is one device of the profile, in its order (`count` repeats a device);
2. a step of b samples on device i costs ``step_s[i] + sample_s[i] · b`` virtual seconds,
   times the jitter's draw (`Config.step_work_of`, `heterogeneity.StepTimer`);
3. every message is priced on the profile's link (α + S/β, `network.py`); where devices give
   links of their own, on the slowest of them (the largest α, the smallest β): a ring or
   tree sum waits for its slowest link at every step.

Where hetsync departs from a per-pair network model: one link prices every message (step 3),
so a fast pair inside a machine is priced like the slowest pair of the cluster. The file:

.. code-block:: json

    {"format": "hetsync-profile", "version": 1,
     "source": "what the numbers are (measured by hetsync probe on ..., or published)",
     "devices": [{"name": "A100", "count": 4, "step_s": 0.002, "sample_s": 1.5e-5},
                 {"name": "T4", "count": 12, "step_s": 0.004, "sample_s": 9.1e-5,
                  "memory_bytes": 16e9, "link": {"latency_s": 5e-5, "bandwidth_bps": 1e9}}],
     "link": {"latency_s": 2e-5, "bandwidth_bps": 1e10},
     "jitter": {"distribution": "lognormal", "sigma": 0.1}}

A device's `alone` (its own `step_s` and `sample_s`) is its step when it computes alone on its
host, where that differs (`hetsync probe` times the devices that share a host both ways: a
one-device run is timed by it). Only `devices` (each with `step_s` and `sample_s`) is
required; `link` defaults to 10 Gbit/s
and 20 µs, `jitter` to none; `model` (the model its devices were timed on; `hetsync probe`
writes it) makes a run of another model refuse the profile. Keys a profile does not know are
refused, so a misspelt one is not silently ignored.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .network import DEFAULT_BANDWIDTH_BPS, DEFAULT_LATENCY_S, Link

FORMAT, VERSION = "hetsync-profile", 1
JITTERS = ("lognormal", "half-normal")


def balanced_batches(batch: int, slowness: Sequence[float],
                     fixed: Sequence[float] = ()) -> list[int]:
    """Each device's batch where batches follow speeds (LB-BSP; `--balanced-batches`): the
    most samples whose step fits in the fastest device's step of `batch`, at least 1.
    `slowness`: each device's time for `batch` (or its slowdown); `fixed`: the part of it
    every step costs whatever its batch (a profile's `step_s`, in the same unit; none: 0),
    so batch_i = ⌊`batch` × (T_min − f_i) ÷ (T_i − f_i)⌋ — with no fixed part, `batch` ×
    the fastest's slowness ÷ its own."""
    fixed = list(fixed) or [0.0] * len(slowness)
    fastest = min(slowness)
    return [batch if t - f <= 0 else max(1, math.floor(batch * (fastest - f) / (t - f) + 1e-9))
            for t, f in zip(slowness, fixed)]


def sample_weights(batches: list[int]) -> list[float]:
    """Each device's share of a step's samples × P, where batches differ: a sum of the P
    gradients, each × its weight, ÷ P is their mean over every sample (1 each where the
    batches are equal)."""
    return [len(batches) * b / sum(batches) for b in batches]


class ProfileError(ValueError):
    """A profile that cannot be read or holds what a profile cannot; the message names the
    file, the key and what would be valid."""


@dataclass(frozen=True)
class Device:
    """One device: a step of b samples costs `step_s` + `sample_s` · b seconds beside the
    cluster's other devices; `alone`, (step_s, sample_s) when it computes alone on its host
    (devices that share a host slow each other down; `hetsync probe` times those both ways).
    None: the same alone."""

    name: str
    step_s: float
    sample_s: float
    memory_bytes: float | None = None
    link: Link | None = None
    alone: tuple[float, float] | None = None

    def seconds(self, batch: float) -> float:
        return self.step_s + self.sample_s * batch

    def by_itself(self) -> "Device":
        """This device as it computes alone on its host (a one-device run's)."""
        if self.alone is None:
            return self
        return Device(self.name, *self.alone, self.memory_bytes, self.link)


@dataclass(frozen=True)
class Jitter:
    """A seeded draw that multiplies each step's time: `lognormal` of mean 1 and σ `sigma`
    (FedScale's), or `half-normal`, 1 + σ|z| (FLSim's: a step is only ever slower)."""

    distribution: str = "lognormal"
    sigma: float = 0.0


@dataclass(frozen=True)
class ClusterProfile:
    devices: tuple[Device, ...]
    link: Link = field(default_factory=Link)
    jitter: Jitter = field(default_factory=Jitter)
    source: str = ""
    #: the model its devices were timed on (`hetsync probe -n`), if it says
    model: str | None = None

    @property
    def slowest_link(self) -> Link:
        """The link every message is priced on (the module docstring, step 3)."""
        links = [self.link] + [d.link for d in self.devices if d.link is not None]
        return Link(max(l.latency_s for l in links), min(l.bandwidth_bps for l in links))

    def batches(self, batch: int) -> list[int]:
        """Each device's batch, balanced to its time at `batch`, its fixed part per step
        counted (`balanced_batches`)."""
        return balanced_batches(batch, [d.seconds(batch) for d in self.devices],
                                [d.step_s for d in self.devices])

    def slowdowns(self, batch: int) -> tuple[float, ...]:
        """Each device's time for `batch` samples over the fastest's."""
        times = [d.seconds(batch) for d in self.devices]
        return tuple(t / min(times) for t in times)

    def to_json(self) -> dict[str, Any]:
        devices = []
        for d in self.devices:
            item = {"name": d.name, "step_s": d.step_s, "sample_s": d.sample_s}
            if d.memory_bytes is not None:
                item["memory_bytes"] = d.memory_bytes
            if d.link is not None:
                item["link"] = _link_json(d.link)
            if d.alone is not None:
                item["alone"] = {"step_s": d.alone[0], "sample_s": d.alone[1]}
            devices.append(item)
        out = {"format": FORMAT, "version": VERSION, "source": self.source,
               "devices": devices, "link": _link_json(self.link),
               "jitter": asdict(self.jitter)}
        if self.model is not None:
            out["model"] = self.model
        return out

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")


def _link_json(link: Link) -> dict[str, float]:
    return {"latency_s": link.latency_s, "bandwidth_bps": link.bandwidth_bps}


def load(path: str | Path) -> ClusterProfile:
    """The profile in file `path`; ProfileError naming the file and what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise ProfileError(f"{path}: cannot be read: {err.strerror or err}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ProfileError(f"{path}: not JSON ({err})") from None
    try:
        return parse(data)
    except ProfileError as err:
        raise ProfileError(f"{path}: {err}") from None


def _keys(where: str, data: Any, required: tuple[str, ...], optional: tuple[str, ...]) -> dict:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected an object, got {data!r:.60}")
    unknown = sorted(set(data) - set(required) - set(optional))
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {unknown}; known: "
                           f"{sorted(required + optional)}")
    missing = [k for k in required if k not in data]
    if missing:
        raise ProfileError(f"{where}: missing {missing}")
    return data


def _number(where: str, value: Any, low: float, high: float = math.inf,
            low_open: bool = False) -> float:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and (value > low if low_open else value >= low)
          and value <= high)
    if not ok:
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        raise ProfileError(f"{where}: invalid value {value!r}; expected a number {bound}"
                           + (f" and <= {high:g}" if high < math.inf else ""))
    return float(value)


def _parse_link(where: str, data: Any) -> Link:
    data = _keys(where, data, (), ("latency_s", "bandwidth_bps"))
    return Link(_number(f"{where}.latency_s", data.get("latency_s", DEFAULT_LATENCY_S), 0, 1),
                _number(f"{where}.bandwidth_bps",
                        data.get("bandwidth_bps", DEFAULT_BANDWIDTH_BPS), 0, low_open=True))


def _step(where: str, item: dict) -> tuple[float, float]:
    step_s = _number(f"{where}.step_s", item["step_s"], 0, 3600)
    sample_s = _number(f"{where}.sample_s", item["sample_s"], 0, 3600)
    if step_s + sample_s == 0:
        raise ProfileError(f"{where}: step_s and sample_s are both 0; a device's step "
                           f"must cost some time")
    return step_s, sample_s


def parse(data: Any) -> ClusterProfile:
    """The profile a JSON object describes (the module docstring); ProfileError naming the
    first key that is wrong."""
    data = _keys("the profile", data, ("devices",),
                 ("format", "version", "source", "model", "link", "jitter"))
    if data.get("format", FORMAT) != FORMAT:
        raise ProfileError(f"format: invalid value {data['format']!r}; expected {FORMAT!r}")
    if data.get("version", VERSION) != VERSION:
        raise ProfileError(f"version: invalid value {data['version']!r}; this hetsync reads "
                           f"version {VERSION}")
    if not isinstance(data["devices"], list) or not data["devices"]:
        raise ProfileError(f"devices: expected a non-empty list of devices, got "
                           f"{data['devices']!r:.60}")
    devices: list[Device] = []
    for i, item in enumerate(data["devices"]):
        where = f"devices[{i}]"
        item = _keys(where, item, ("step_s", "sample_s"),
                     ("name", "count", "memory_bytes", "link", "alone"))
        count = item.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 4096:
            raise ProfileError(f"{where}.count: invalid value {count!r}; expected an integer "
                               f"in 1..4096")
        step_s, sample_s = _step(where, item)
        memory = item.get("memory_bytes")
        alone = None
        if "alone" in item:
            alone = _step(f"{where}.alone", _keys(f"{where}.alone", item["alone"],
                                                  ("step_s", "sample_s"), ()))
        device = Device(str(item.get("name", f"device {i}")), step_s, sample_s,
                        None if memory is None else _number(f"{where}.memory_bytes", memory, 0),
                        None if "link" not in item else _parse_link(f"{where}.link",
                                                                    item["link"]), alone)
        devices += [device] * count
    jitter = _keys("jitter", data.get("jitter", {}), (), ("distribution", "sigma"))
    distribution = jitter.get("distribution", "lognormal")
    if distribution not in JITTERS:
        raise ProfileError(f"jitter.distribution: invalid value {distribution!r}; expected "
                           f"one of {', '.join(JITTERS)}")
    return ClusterProfile(tuple(devices), _parse_link("link", data.get("link", {})),
                          Jitter(distribution, _number("jitter.sigma", jitter.get("sigma", 0),
                                                       0, 2)),
                          str(data.get("source", "")),
                          None if data.get("model") is None else str(data["model"]))
