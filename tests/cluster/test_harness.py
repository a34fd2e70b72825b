"""The cluster itself: two compute nodes that run steps and array elements (CI's cluster tier).

Prints what the closing note quotes: the hostnames `srun -N2 hostname` printed and the node
each array element ran on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]


def test_srun_spans_both_nodes(slurm):
    out = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "hostname"]).stdout.split()
    print(f"srun -N2 hostname: {' '.join(out)}")
    assert sorted(out) == sorted(slurm.nodes)


def test_array_lands_on_both_nodes(slurm):
    out = slurm.work / "array"
    out.mkdir()
    # --exclusive: one element per node, so two elements cannot share a node.
    job = slurm.submit(f"""#!/bin/sh
#SBATCH --array=0-1
#SBATCH --exclusive
#SBATCH --output={out}/%A_%a.out
echo "$SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $(hostname)"
""")
    hosts = {}
    for task in (0, 1):
        fields = slurm.wait_state(f"{job}_{task}", "COMPLETED", timeout=60)
        line = (out / f"{job}_{task}.out").read_text().split()
        assert line[:2] == [job, str(task)], line
        hosts[task] = line[2]
        assert fields["NodeList"] == line[2]
        print(f"array {job} element {task}: ran on {line[2]} (JobId {fields['JobId']})")
    assert sorted(hosts.values()) == sorted(slurm.nodes)


def test_nodes_run_the_checkouts_python_on_the_shared_work_root(slurm):
    # What every case relies on: the .venv interpreter and the checkout at the same paths on
    # each node, and a file a job writes visible at once to the test process.
    probe = ("import socket, sys, aleph; from pathlib import Path; "
             "Path(sys.argv[1], socket.gethostname()).write_text(aleph.__file__)")
    slurm.run(["srun", "-N2", "--ntasks-per-node=1", sys.executable, "-c", probe,
               str(slurm.work)], env={"PYTHONPATH": str(REPO)}, timeout=120)
    for node in slurm.nodes:
        assert (slurm.work / node).read_text() == str(REPO / "aleph" / "__init__.py")
    print(f"{sys.executable} imported {REPO / 'aleph'} on {', '.join(slurm.nodes)}")
