"""The emulated network: hosts in network namespaces joined by tc-shaped links, and what those
links carry when measured.

    netem.py         Network: namespaces, veth pairs, a bridge and tbf-shaped links; cleanup by owner
    host_cpu.py      a host's CPU share: a cgroup with a CPU quota per host (network.host_cpus)
    firewall.py      the ACCEPT rule a bridge needs where the host's firewall sees bridged frames
    names.py         the owner + token names of everything the above create (how leftovers are found)
    link_measure.py  a link's goodput and latency measured between emulated hosts (one pair or a group)

Used by the sweep (service/sweep/network.py builds a trial's hosts) and by the trial's workers
(service/train/ray_entry.py joins a rank to its host); nothing here imports Ray or MLflow.
"""
