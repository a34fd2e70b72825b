"""aleph.train: `aleph train`, one launch of one run. A launch reads top to bottom as
command.train_command -> run.train -> trainer.build_trainer -> loop.train_loop ->
step.train_step; README.md in this directory gives each file's job.
"""
