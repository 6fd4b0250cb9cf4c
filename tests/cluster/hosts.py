"""Several hosts on one machine: network namespaces joined by veth pairs, each running one Ray node.

    with Hosts(2) as hosts:               # h0 (the head) and h1, at 10.<a>.<b>.1 and .2, only inside them
        hosts.start_ray()                 # token auth on, the virtualenv first on PATH (the README's steps)
        hosts.run(0, ["ray", "job", "submit", ...])
        hosts.remove(1)                   # host 1's every process SIGKILLed: the host is gone

Each host is a namespace with its loopback and one veth end; a host's addresses exist only inside the
namespaces, so its Ray binds to them and nothing on the machine can reach them by accident, and the
hostname still resolves to 127.0.0.1 as on many real hosts (the trap a learner group must avoid). Two
hosts: one veth pair; more: each host's veth goes to a bridge in a namespace of its own (the switch).
Teardown (every exit path): SIGKILL every process inside the namespaces (`ip netns pids`: exactly this
harness's), then delete the namespaces, which deletes their veth ends. Needs root and `ip`; `skip_reason`
says why not.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
# A dead node noticed within ~1 s (Ray's default, ~16 s, would only slow the test down).
FAST_HEALTH_CHECK = {"RAY_health_check_initial_delay_ms": "0", "RAY_health_check_period_ms": "500",
                     "RAY_health_check_timeout_ms": "500", "RAY_health_check_failure_threshold": "2"}
# Ray's own metrics off where a test removes a node and reads no metric: after the loss, Ray 2.60's dashboard agent
# replays each observation its workers' histograms report (their retries to the dead node) as one call of Python
# apiece (`record_histogram_aggregated_batch`, ray-project/ray#64891) and keeps a core busy for 20-40 s.
NO_RAY_METRICS = {"RAY_enable_metrics_collection": "0"}


def skip_reason() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces (CI runs as root)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` to create network namespaces"
    probe = f"solrl-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Hosts:
    """`count` hosts h0 … (h0: the Ray head), each a network namespace with address `address(i)`."""

    def __init__(self, count: int, cpus: float = 2, gpus: list[int] | None = None) -> None:
        """`gpus`: logical GPUs per host (Ray resources with no device behind them), to steer GPU actors."""
        self.count, self.cpus, self.gpus = count, cpus, gpus or [0] * count
        self.tag = f"{os.getpid() % 100000}{secrets.token_hex(1)}"  # short: interface names take 15 characters
        self.subnet = f"10.{200 + os.getpid() % 50}.{secrets.randbelow(250)}"
        self.namespaces = [f"solrl-{self.tag}-h{i}" for i in range(count)]
        self.temp = Path(tempfile.mkdtemp(prefix="rayns", dir="/tmp"))  # short: Ray's socket paths
        self.token = self.temp / "auth_token"
        self.token.write_text(secrets.token_hex(32))
        self.logs: dict[int, Path] = {}
        self.procs: dict[int, subprocess.Popen] = {}

    # ---- the network ---------------------------------------------------------------------------------
    def address(self, host: int) -> str:
        return f"{self.subnet}.{host + 1}"

    def interface(self, host: int) -> str:
        """The name of host `host`'s veth end (its data interface)."""
        return f"s{self.tag}h{host}"

    def __enter__(self) -> Hosts:
        try:
            for ns in self.namespaces:
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            if self.count == 2:
                _ip("link", "add", self.interface(0), "type", "veth", "peer", "name", self.interface(1))
                for host in range(2):
                    _ip("link", "set", self.interface(host), "netns", self.namespaces[host])
            else:
                switch = f"solrl-{self.tag}-sw"
                self.namespaces.append(switch)
                _ip("netns", "add", switch)
                _ip("-n", switch, "link", "add", "br0", "type", "bridge")
                _ip("-n", switch, "link", "set", "br0", "up")
                for host in range(self.count):
                    port = f"s{self.tag}p{host}"
                    _ip("link", "add", self.interface(host), "type", "veth", "peer", "name", port)
                    _ip("link", "set", self.interface(host), "netns", self.namespaces[host])
                    _ip("link", "set", port, "netns", switch)
                    _ip("-n", switch, "link", "set", port, "master", "br0")
                    _ip("-n", switch, "link", "set", port, "up")
            for host in range(self.count):
                ns = self.namespaces[host]
                _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", self.interface(host))
                _ip("-n", ns, "link", "set", self.interface(host), "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    # ---- processes in a host ---------------------------------------------------------------------------
    def env(self, **extra: str) -> dict[str, str]:
        """A client's or node's environment: the cluster's token, the virtualenv first on PATH."""
        env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token),
               "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               **FAST_HEALTH_CHECK, **NO_RAY_METRICS, **extra}
        env.pop("RAY_ADDRESS", None)
        return env

    def command(self, host: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[host], *argv]

    def run(self, host: int, argv: list[str], timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(host, argv), env=self.env(**env), timeout=timeout, capture_output=True,
                              text=True)

    def start_ray(self, **env: str) -> None:
        """A Ray head on h0 (dashboard and job server on its address), a worker on every other host; waits
        until every node has joined."""
        for host in range(self.count):
            node = ["--head", "--port", "6379", "--dashboard-host", self.address(0)] if host == 0 else [
                "--address", f"{self.address(0)}:6379"]
            log = self.temp / f"h{host}.log"
            self.logs[host] = log
            with open(log, "w") as out:
                self.procs[host] = subprocess.Popen(
                    self.command(host, [str(VENV_BIN / "ray"), "start", "--block", *node, "--node-ip-address",
                                        self.address(host), "--num-cpus", str(self.cpus), "--num-gpus",
                                        str(self.gpus[host]), "--disable-usage-stats",
                                        "--temp-dir", str(self.temp / f"h{host}")]),
                    env=self.env(**env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self._wait_for(host, "will now block")

    def _wait_for(self, host: int, text: str, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.logs[host].read_text():
            if self.procs[host].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray on host {host} did not start:\n{self.logs[host].read_text()[-3000:]}")
            time.sleep(0.5)

    @property
    def dashboard(self) -> str:
        return f"http://{self.address(0)}:8265"

    def host_of(self, ip: str) -> int:
        """Which host has address `ip`."""
        return [self.address(h) for h in range(self.count)].index(ip)

    def pids(self, host: int) -> list[int]:
        """Every process inside host `host`'s namespace."""
        listed = subprocess.run(["ip", "netns", "pids", self.namespaces[host]], capture_output=True, text=True)
        return [int(p) for p in listed.stdout.split()]

    def remove(self, host: int) -> None:
        """Host `host` is gone: every process in it SIGKILLed at once (its raylet, its actors)."""
        for pid in self.pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        for host in range(len(self.namespaces)):
            for _ in range(20):  # a process may fork while it is being killed: until the namespace is empty
                if not self.pids(host):
                    break
                self.remove(host)
                time.sleep(0.2)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(self.temp, ignore_errors=True)
