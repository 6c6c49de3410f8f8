"""Slurm: control of a running cluster (:mod:`.control`) and its generated config (:mod:`.conf`).

Automatic drains and resumes do not call :mod:`.control` directly: they go through
:mod:`gpuforge.admission`, the one path into Slurm.
"""
