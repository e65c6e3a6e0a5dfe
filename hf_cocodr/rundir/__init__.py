"""The run folder: who wrote an output folder and who writes it now (:mod:`~hf_cocodr.rundir.run_record`, its lock
in :mod:`~hf_cocodr.rundir.locks`), the trainers' checkpoints (:mod:`~hf_cocodr.rundir.checkpoints`) and the state
they save beside them (:mod:`~hf_cocodr.rundir.state`). Import the modules themselves: this package imports nothing."""
