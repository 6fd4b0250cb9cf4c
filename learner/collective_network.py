"""Which network interface a learner rank's collectives use, decided once per rank before it joins.

gloo and NCCL pick their own interface when told nothing: gloo binds to the address the hostname
resolves to (often 127.0.0.1 through /etc/hosts), NCCL to the first interface that is up and not
loopback (on a GPU node often the management network, not the data network). Either way two hosts may
not reach each other although Ray connects them. So each rank binds to, in order:

    1. `cluster.learner.network.interface` (a name) or `.subnet` (the interface whose address is in it),
    2. GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME when the job's environment sets them (left as they are),
    3. the interface that carries the node's Ray IP (`ray.util.get_node_ip_address()`): the address
       the other nodes already reach this one on.

The choice is exported as GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, the variables both libraries
read when the process group forms (torch's ProcessGroupGloo, NCCL's socket bootstrap). NCCL_IB_* (which
InfiniBand devices carry NCCL's data) stays the user's to set.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


@dataclass(frozen=True)
class Binding:
    """The interface a rank's collectives use. `interface` None: the libraries' own choice (a variable
    the user set, or nothing found); `address`: that interface's address, as the peers should dial it."""

    interface: str | None
    address: str | None
    reason: str

    def describe(self) -> str:
        where = f"{self.interface} ({self.address})" if self.interface else "the libraries' default interface"
        return f"{where}, chosen by {self.reason}"


def interface_addresses() -> dict[str, list[str]]:
    """Each interface of this host → its IPv4 and IPv6 addresses (scope suffixes dropped)."""
    families = (socket.AF_INET, socket.AF_INET6)
    return {name: [a.address.split("%")[0] for a in addresses if a.family in families]
            for name, addresses in psutil.net_if_addrs().items()}


def choose(node_ip: str, *, interface: str | None = None, subnet: str | None = None,
           environ: Mapping[str, str] = os.environ) -> Binding:
    """The interface this rank binds to (see the module docstring for the order). An interface or subnet
    that this host lacks raises ValueError naming what the host has, before anything connects."""
    interfaces = interface_addresses()
    if interface is not None:
        if interface not in interfaces:
            raise ValueError(f"cluster.learner.network.interface={interface!r}: host {socket.gethostname()} has "
                             f"no such interface (it has {_listing(interfaces)}); set an interface of every "
                             "learner node, or .subnet to pick each node's interface by address")
        return Binding(interface, _first(interfaces[interface]), "cluster.learner.network.interface")
    if subnet is not None:
        network = ipaddress.ip_network(subnet, strict=False)
        for name, addresses in sorted(interfaces.items()):
            for address in addresses:
                if ipaddress.ip_address(address) in network:
                    return Binding(name, address, f"cluster.learner.network.subnet={subnet}")
        raise ValueError(f"cluster.learner.network.subnet={subnet}: no interface of host {socket.gethostname()} "
                         f"has an address in it (it has {_listing(interfaces)})")
    preset = [f"{v}={environ[v]}" for v in VARIABLES if environ.get(v)]
    if preset:
        return Binding(None, None, " and ".join(preset))
    for name, addresses in sorted(interfaces.items()):
        if node_ip in addresses:
            return Binding(name, node_ip, f"carrying the node IP {node_ip}")
    return Binding(None, None, f"no interface carries the node IP {node_ip} (it has {_listing(interfaces)})")


def apply(binding: Binding, environ: dict[str, str] | os._Environ = os.environ) -> None:
    """Export the choice for gloo and NCCL (a binding without an interface changes nothing)."""
    if binding.interface is not None:
        for variable in VARIABLES:
            environ[variable] = binding.interface


def _first(addresses: list[str]) -> str | None:
    """An interface's address peers dial: its IPv4 one if it has one."""
    v4 = [a for a in addresses if ipaddress.ip_address(a).version == 4]
    return (v4 or addresses or [None])[0]


def _listing(interfaces: dict[str, list[str]]) -> str:
    return ", ".join(f"{name} {'/'.join(a) or '-'}" for name, a in sorted(interfaces.items()))
