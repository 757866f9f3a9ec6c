"""The batch scheduler's view of the job, for meta.json: under SLURM, its job id, node list and
allocation, from the variables SLURM sets for every task (sbatch/srun's "OUTPUT ENVIRONMENT
VARIABLES"); torchrun passes them on to the ranks."""

from __future__ import annotations

import os

# meta.json key -> SLURM's variable
SLURM_VARS = {
    "job_id": "SLURM_JOB_ID",
    "job_name": "SLURM_JOB_NAME",
    "cluster": "SLURM_CLUSTER_NAME",
    "partition": "SLURM_JOB_PARTITION",
    "nodelist": "SLURM_JOB_NODELIST",
    "nodes": "SLURM_JOB_NUM_NODES",
    "ntasks": "SLURM_NTASKS",
    "cpus_on_node": "SLURM_CPUS_ON_NODE",
    "gpus_on_node": "SLURM_GPUS_ON_NODE",
    "restart_count": "SLURM_RESTART_COUNT",
    "submit_dir": "SLURM_SUBMIT_DIR",
    "submit_host": "SLURM_SUBMIT_HOST",
    "time_limit_end": "SLURM_JOB_END_TIME",
}


def slurm_job(environ: dict | None = None) -> dict | None:
    """The SLURM job this process runs in (the variables it sets), or None outside SLURM."""
    env = os.environ if environ is None else environ
    if not env.get("SLURM_JOB_ID"):
        return None
    return {key: env[var] for key, var in SLURM_VARS.items() if env.get(var)}


def jobs_so_far(previous_meta: dict | None, current: dict | None) -> list[dict]:
    """Every SLURM job that worked on a run folder, oldest first: a resumed run's earlier jobs
    (its meta.json's ``slurm_jobs``), then this one."""
    earlier = list((previous_meta or {}).get("slurm_jobs") or [])
    return earlier + ([current] if current else [])
