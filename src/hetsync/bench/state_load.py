"""Load on the state server: N well-formed ESync reports from C concurrent keep-alive clients.

The server runs as its own process (`hetsync state-server`, as in a real run) and the load
comes from one asyncio process, so on a 2-core machine each has a core. Client k reports for
rank k with a step time of (k + 1) × 10 ms, one round further each time, so the readiness rule
does its real work (rounds start, the slowest is found, round lengths are planned). Prints
requests/s, the 50th and 99th percentile latency (request written → answer read) and the
errors (non-2xx answers, broken connections).

Usage::

    hetsync bench state --requests 20000 --clients 16
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass


@dataclass
class LoadResult:
    requests: int
    clients: int
    seconds: float
    errors: int
    p50_ms: float
    p99_ms: float

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds


def _request(rank: int, round_: int, step_time: float) -> bytes:
    body = json.dumps({"rank": rank, "round": round_, "steps": 1,
                       "step_time": step_time}).encode()
    token = os.environ.get("HETSYNC_TOKEN")  # the server started below reads it too
    auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
    return (b"POST /report HTTP/1.1\r\nHost: state\r\nContent-Type: application/json\r\n"
            b"%sContent-Length: %d\r\n\r\n%s" % (auth, len(body), body))


async def _client(host: str, port: int, rank: int, count: int, latencies: list,
                  errors: list) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for i in range(count):
            started = time.perf_counter()
            writer.write(_request(rank, i + 1, 0.01 * (rank + 1)))
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            if not head.startswith(b"HTTP/1.1 2"):
                errors.append(head.split(b"\r\n")[0].decode())
    except (OSError, asyncio.IncompleteReadError) as err:
        errors.append(f"{type(err).__name__}: {err}")
    finally:
        writer.close()


async def drive(host: str, port: int, requests: int, clients: int) -> LoadResult:
    """`requests` reports (rounded down to a multiple of `clients`) from `clients` connections."""
    latencies: list[float] = []
    errors: list[str] = []
    each = requests // clients
    started = time.perf_counter()
    await asyncio.gather(*(_client(host, port, k, each, latencies, errors)
                           for k in range(clients)))
    seconds = time.perf_counter() - started
    latencies.sort()
    pick = lambda q: 1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))]  # noqa: E731
    return LoadResult(len(latencies), clients, seconds, len(errors),
                      pick(0.5) if latencies else float("nan"),
                      pick(0.99) if latencies else float("nan"))


def start_server(workers: int) -> tuple[subprocess.Popen, int]:
    """`hetsync state-server` on a free loopback port, as its own process."""
    proc = subprocess.Popen([sys.executable, "-m", "hetsync", "state-server", "--port", "0",
                             "--workers", str(workers)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # "hetsync state server on http://127.0.0.1:PORT/ ..."
    try:
        port = int(line.split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    except (IndexError, ValueError):
        proc.kill()
        raise RuntimeError(f"the state server did not start: {line!r}") from None
    return proc, port


def main(argv: list[str] | None = None) -> int:
    from hetsync.command_line import ArgumentParser

    parser = ArgumentParser(prog="hetsync bench state", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= 1024 or args.requests < args.clients:
        parser.error(f"--clients {args.clients} / --requests {args.requests}: need "
                     f"1 <= clients <= 1024 and requests >= clients")
    try:
        proc, port = start_server(args.clients)
    except RuntimeError as err:
        print(f"hetsync bench state: error: {err}", file=sys.stderr)
        return 1
    try:
        result = asyncio.run(drive("127.0.0.1", port, args.requests, args.clients))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(f"{'requests':>9} {'clients':>8} {'seconds':>8} {'req/s':>8} {'p50 ms':>7} "
          f"{'p99 ms':>7} {'errors':>7}")
    print(f"{result.requests:>9} {result.clients:>8} {result.seconds:>8.2f} "
          f"{result.per_second:>8.0f} {result.p50_ms:>7.2f} {result.p99_ms:>7.2f} "
          f"{result.errors:>7}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**asdict(result), "per_second": result.per_second}, f, indent=1)
    return 1 if result.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
