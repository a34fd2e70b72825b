"""aleph.campaign: `aleph campaign`, every (arm, seed) of one config run once to completion.

Each run is a subprocess `python -m aleph train ...` on one device (a GPU or a CPU slot),
one run per device at a time; then every complete run is evaluated, tabulated and diffed
(docs/ARCHITECTURE.md, "campaign"). Nothing below imports this package.

Files by role: spec (arms, seeds, config, devices), state (the campaign's JSON file in the
work root, written atomically), procs (child processes: launch, liveness, the run lock
probe, signals), rundirs (what a run directory says: complete, how a launch ended), runner
(the scheduler), finish (evaluation, report, diff matrix, summary).

`--on slurm` schedules nothing itself: slurm_site (the site options, checked), slurm (the
sbatch scripts: a training array and a finish job that runs `--finish-only`, i.e. finish.py),
slurm_main (write, submit, record the job ids); status (`aleph campaign status`: each run's
state from its run directory, the recorded jobs in squeue).
"""
