"""The config's upper bounds (values no sensible sweep reaches) and the defaults other layers
share with it (the report's tolerance, the metric logger's flush interval)."""

# Upper bounds that no sensible sweep reaches: they turn a typo (an extra zero or three) into a
# clear error instead of a sweep that runs for a month or a batch that exhausts memory.
MAX_STEPS = 1_000_000
MAX_GLOBAL_BATCH = 1_048_576
MAX_GRAD_ACCUMULATION = 1024
MAX_WORLD_SIZE = 1024
MAX_PROJECTED_WORLD_SIZE = 1_048_576  # report.project / report.cluster: priced, not run
MAX_SEED = 2**32 - 1
MAX_LR = 10.0
MAX_TRIALS = 10_000
MAX_ADAPTIVE_SEEDS = 20   # search.seed: {min, max}: a round per seed, each a look the rule pays for
MAX_FILE_BYTES = 1_000_000
# DDP's gradient buckets: 25 MiB is DDP's own default (torch.nn.parallel.distributed); a cap
# above 1 GiB is one bucket for any model this service trains, written with a typo.
DDP_BUCKET_CAP_MB = 25.0
MAX_BUCKET_CAP_MB = 1024.0
# A config is a few dozen values; YAML aliases can expand a small file into billions of nodes.
MAX_YAML_NODES = 100_000
MAX_LINK_GBPS = 400.0
MAX_LATENCY_MS = 1000.0
# network.host_cpus: the kernel's smallest CFS quota is 1 ms, per a host's 10 ms period
# (service/network/host_cpu.py)
MIN_HOST_CPUS, MAX_HOST_CPUS = 0.1, 1024.0
# Defaults read beyond the schema: one home each.
DEFAULT_TARGET_TOLERANCE = 0.01  # report.target_tolerance, and the report's own default
DEFAULT_FLUSH_SECONDS = 5.0  # tracking.flush_seconds, and MetricLogger's own default
# report.project / report.cluster latency_ms: one way per message between two ranks over gloo's
# TCP (docs/hooks.md, "The latency the report prices"): the kernel stack on both hosts and a
# switch, tens of µs, not the few µs of RDMA gloo never uses.
DEFAULT_PROJECTED_LATENCY_MS = 0.025
