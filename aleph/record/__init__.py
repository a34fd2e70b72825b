"""The run record: what each launch of a run executed, on what, and what it did.

One place that `aleph.train` writes and `aleph.report` (and `aleph.eval`) reads, so the
schema of a launch entry in `manifest.json` and the meaning of its fields are defined
once:
- `launch`: statuses, actions, step ranges and the readers of `launches[]`;
- `layout`: the run directory's names, the resume-state format (step directories, the
  COMPLETE marker written and read, the link rule) and the format version of its files;
- `provenance`: code revision and source hash, environment summary, the resource
  envelope (cgroup memory/CPU quota, cpuset, NUMA node, GPUs, driver), execution facts;
- `heartbeat`: the live launch's heartbeat file and the diagnosis of a vanished launch
  (the cgroup OOM killer named when its counter rose or usage was at the limit);
- `fingerprint`: which functions of `aleph/` a launch executed, as source hashes, and
  the mapping of changed lines to those functions.

Layer: below train/eval/report, beside model/targets/data; it depends on `aleph.env`
and `aleph._io` only (docs/ARCHITECTURE.md).
"""
