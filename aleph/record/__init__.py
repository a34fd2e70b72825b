"""The run record: what each launch of a run executed, on what, and what it did.

What `aleph.train` writes and eval/report/sync read, defined once: `launch` (statuses,
actions, step ranges of `launches[]`), `layout` (run directory names, resume-state format,
format version), `provenance` (code identity, environment, resource envelope),
`heartbeat` (live launches, diagnosis of vanished ones), `fingerprint` and `executed`
(which functions a launch executed, and changed lines judged against them).

Layer: below train/eval/report, beside model/targets/data; it depends on `aleph.env`
and `aleph._io` only (docs/ARCHITECTURE.md).
"""
