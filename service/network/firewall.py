"""The host's firewall and our emulated networks: where bridged frames meet iptables (br_netfilter
on, as Docker sets it), each network's bridge gets an ACCEPT rule in FORWARD, commented with its
owner (service/network/names.py) so a killed owner's rules are found and removed; and when frames
still do not arrive, the likeliest reason in one clause."""

from __future__ import annotations

import shlex
import shutil
import subprocess

from service.network.names import ALIAS_RE

BRIDGE_NF = "/proc/sys/net/bridge/bridge-nf-call-iptables"


def _iptables(*args: str) -> str:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True).stdout


def bridge_netfilter_on() -> bool:
    """Do frames crossing a bridge go through the host's firewall (br_netfilter on, as Docker
    sets it)? Then a FORWARD chain that drops by default (Docker's policy) drops the frames
    between our hosts too. The bridge's own ``nf_call_iptables 0`` does not help: the kernel
    hands a frame to iptables when the bridge's option *or* this sysctl is on."""
    try:
        with open(BRIDGE_NF) as f:
            return f.read().strip() == "1"
    except OSError:  # br_netfilter not loaded: bridged frames never meet the firewall
        return False


def sees_bridges() -> bool:
    """Bridged frames meet iptables, where a rule of ours can let them pass."""
    return bridge_netfilter_on() and shutil.which("iptables") is not None


def accept_rule(bridge: str, alias: str) -> list[str]:
    """iptables arguments (after the chain) that let frames between the bridge's ports pass."""
    return ["-i", bridge, "-o", bridge, "-m", "comment", "--comment", alias, "-j", "ACCEPT"]


def list_rules() -> list[tuple[list[str], int]]:
    """Our ACCEPT rules in iptables' FORWARD chain: (rule arguments, owner pid)."""
    if shutil.which("iptables") is None:
        return []
    out = []
    for line in _iptables("-S", "FORWARD").splitlines():
        args = shlex.split(line)
        if args[:2] != ["-A", "FORWARD"] or "--comment" not in args:
            continue
        match = ALIAS_RE.match(args[args.index("--comment") + 1])
        if match:
            out.append((args[2:], int(match.group(1))))
    return out


def why_blocked() -> str:
    """The likeliest reason frames between two hosts of one bridge do not arrive, one clause."""
    if not bridge_netfilter_on():
        return "the bridge does not forward between its ports (look for filtering in `nft list ruleset`)"
    if shutil.which("iptables") is None:
        return ("bridged frames go through the host's firewall (net.bridge.bridge-nf-call-iptables = 1) and "
                "there is no iptables to let them pass: allow frames on bridges chs* (`nft list ruleset`)")
    drop = _iptables("-S", "FORWARD").splitlines()[:1] == ["-P FORWARD DROP"]
    return ("bridged frames go through the host's firewall (net.bridge.bridge-nf-call-iptables = 1"
            + (", iptables FORWARD policy DROP: Docker sets both" if drop else "") + ") and it drops them "
            "despite this network's ACCEPT rule (`iptables -S FORWARD`, `nft list ruleset` show what "
            "does): let frames on bridges chs* pass")
