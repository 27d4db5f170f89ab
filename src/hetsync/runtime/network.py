"""Real bandwidth limits on one machine: each process of a run on its own emulated host.

`hetsync launch --bandwidth 100mbit` runs every rank in its own Linux network namespace, joined
to the others by a veth pair into one bridge (a switch), with a token-bucket filter
(`tc qdisc … tbf`) on both ends of each pair: every host sends and receives at most the rate,
as a machine with that network card would. The service the mode declares
(`ModeSpec.service`) listens on the bridge's own address. Needs root and iproute2's `ip` and `tc`;
netem is not used (it is missing from some kernels).

Every namespace, link and qdisc made here carries the launcher's process id in its name and is
removed by `close()` — also after Ctrl-C or a failed rank, since the launcher closes it in a
`finally` — and whatever a killed launcher left behind is removed by the next one
(`remove_stale`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from hetsync.clock.network import parse_rate  # noqa: F401 - (the rate syntax's one place)

#: tbf's bucket: at least 128 KB, so that a full-size burst at a high rate is not cut
BURST_BYTES = 128 * 1024
PREFIX = "hs"


class NetworkUnavailable(RuntimeError):
    """The machine cannot make the emulated network (not root, no `ip`/`tc`, ...)."""


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise NetworkUnavailable(f"`{' '.join(argv)}` failed: "
                                 f"{(done.stderr or done.stdout).strip()}")
    return done.stdout


def check_available() -> None:
    """NetworkUnavailable saying why, if this machine cannot make the emulated network."""
    if os.geteuid() != 0:
        raise NetworkUnavailable("emulated hosts need root (network namespaces and tc "
                                 "qdiscs); run as root or leave --bandwidth out")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise NetworkUnavailable(f"emulated hosts need iproute2's {' and '.join(missing)} "
                                 f"(Debian: apt-get install iproute2)")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Remove the namespaces and bridges of launchers that are gone; their names."""
    removed = []
    names = [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line]
    links = re.findall(r"^\d+: ([^:@]+)", _run("ip", "-o", "link", "show"), re.M)
    for name in names + links:
        match = re.match(rf"^{PREFIX}(\d+)-", name)
        if match and not _alive(int(match.group(1))):
            kind = "netns" if name in names else "link"
            subprocess.run(["ip", kind, "del", name], capture_output=True)
            removed.append(name)
    return removed


@dataclass
class LimitedNetwork:
    """`hosts` emulated hosts on one bridge, each link limited to `rate` both ways.

    Host k is the namespace `namespace(k)` with address `address(k)`; the bridge (this
    machine's side) has `bridge_address`. Use as a context manager, or call `close()`.
    """

    hosts: int
    rate: str
    owner: int = field(default_factory=os.getpid)
    subnet: str = ""
    made: list[tuple[str, str]] = field(default_factory=list)  # ("netns"|"link", name)

    def __post_init__(self) -> None:
        parse_rate(self.rate)
        if not 1 <= self.hosts <= 250:
            raise ValueError(f"hosts must be in 1..250, got {self.hosts}")
        if not self.subnet:
            self.subnet = f"10.{200 + self.owner % 50}.{self.owner % 250}"

    # ------------------------------------------------------------------ names and addresses
    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.owner}-br"

    @property
    def bridge_address(self) -> str:
        return f"{self.subnet}.1"

    def namespace(self, k: int) -> str:
        return f"{PREFIX}{self.owner}-{k}"

    def address(self, k: int) -> str:
        return f"{self.subnet}.{k + 2}"

    def command(self, k: int, argv: list[str]) -> list[str]:
        """`argv` run on host k."""
        return ["ip", "netns", "exec", self.namespace(k), *argv]

    #: the host's interface name inside its namespace (GLOO_SOCKET_IFNAME)
    interface = "eth0"

    # ------------------------------------------------------------------ making and removing
    def open(self) -> "LimitedNetwork":
        check_available()
        remove_stale()
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def _make(self) -> None:
        rate, burst = self.rate, str(BURST_BYTES)
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        _run("ip", "addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for k in range(self.hosts):
            ns, outer, inner = self.namespace(k), f"{PREFIX}{self.owner}-{k}h", f"{PREFIX}{self.owner}-{k}n"
            _run("ip", "netns", "add", ns)
            self.made.append(("netns", ns))
            _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            self.made.append(("link", outer))
            _run("ip", "link", "set", inner, "netns", ns)
            _run("ip", "-n", ns, "link", "set", inner, "name", self.interface)
            _run("ip", "-n", ns, "addr", "add", f"{self.address(k)}/24", "dev", self.interface)
            _run("ip", "-n", ns, "link", "set", self.interface, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "link", "set", outer, "master", self.bridge, "up")
            # the host's upload, then its download (the bridge's side sends to it)
            _run("tc", "-n", ns, "qdisc", "add", "dev", self.interface, "root", "tbf",
                 "rate", rate, "burst", burst, "latency", "100ms")
            _run("tc", "qdisc", "add", "dev", outer, "root", "tbf", "rate", rate,
                 "burst", burst, "latency", "100ms")

    def close(self) -> None:
        """Remove everything made, newest first (a namespace takes its end of the pair and
        its qdisc with it; the bridge goes last)."""
        while self.made:
            kind, name = self.made.pop()
            subprocess.run(["ip", kind, "del", name], capture_output=True)

    def __enter__(self) -> "LimitedNetwork":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()
