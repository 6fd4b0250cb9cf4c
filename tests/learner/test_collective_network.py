"""Which interface a learner rank's collectives bind to, on this host's real interfaces."""

from __future__ import annotations

import pytest

from learner import collective_network
from learner.collective_network import Binding, choose, interface_addresses


def test_the_interface_carrying_the_node_ip_is_chosen():
    assert "127.0.0.1" in interface_addresses()["lo"]
    assert choose("127.0.0.1", environ={}) == Binding("lo", "127.0.0.1", "carrying the node IP 127.0.0.1")


def test_a_variable_the_user_set_is_left_to_the_libraries():
    binding = choose("127.0.0.1", environ={"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": ""})
    assert binding == Binding(None, None, "NCCL_SOCKET_IFNAME=ib0")
    environ = {"NCCL_SOCKET_IFNAME": "ib0"}
    collective_network.apply(binding, environ)
    assert environ == {"NCCL_SOCKET_IFNAME": "ib0"}


def test_the_config_overrides_the_variables_and_is_exported_for_both_libraries():
    binding = choose("10.9.9.9", interface="lo", environ={"GLOO_SOCKET_IFNAME": "eth7"})
    assert binding == Binding("lo", "127.0.0.1", "cluster.learner.network.interface")
    environ = {"GLOO_SOCKET_IFNAME": "eth7"}
    collective_network.apply(binding, environ)
    assert environ == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert choose("10.9.9.9", subnet="127.0.0.0/8", environ={}) == Binding(
        "lo", "127.0.0.1", "cluster.learner.network.subnet=127.0.0.0/8")


def test_what_the_host_lacks_is_refused_naming_what_it_has():
    with pytest.raises(ValueError,
                       match=r"interface='nope0': host .* has no such interface \(it has .*lo 127\.0\.0\.1"):
        choose("127.0.0.1", interface="nope0")
    with pytest.raises(ValueError, match=r"subnet=203\.0\.113\.0/24: no interface of host .* has an address in it"):
        choose("127.0.0.1", subnet="203.0.113.0/24")


def test_a_node_ip_on_no_interface_leaves_the_choice_to_the_libraries():
    binding = choose("203.0.113.7", environ={})
    assert binding.interface is None
    assert binding.reason.startswith("no interface carries the node IP 203.0.113.7 (it has ")
    assert binding.describe().startswith("the libraries' default interface, chosen by no interface carries")
