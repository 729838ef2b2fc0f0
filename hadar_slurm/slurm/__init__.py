"""The Slurm boundary: argv builders (:mod:`.commands`), one subprocess runner (:mod:`.runner`)
and pure parsers of Slurm's output (:mod:`.parse`).  Nothing here goes through a shell."""

from hadar_slurm.slurm.errors import (
    SlurmCommandError,
    SlurmConfigError,
    SlurmError,
    SlurmParseError,
    SlurmTimeoutError,
)
from hadar_slurm.slurm.parse import (
    Gres,
    SlurmJob,
    SlurmMeta,
    SlurmNode,
    expand_hostlist,
    json_meta,
    parse_gres,
    parse_job_ids,
    parse_sbatch_parsable,
    parse_scontrol_records,
    parse_scontrol_show,
    parse_sinfo_json,
    parse_squeue_json,
)
from hadar_slurm.slurm.runner import CommandResult, RunAs, SlurmRunner

__all__ = [
    "CommandResult",
    "Gres",
    "RunAs",
    "SlurmCommandError",
    "SlurmConfigError",
    "SlurmError",
    "SlurmJob",
    "SlurmMeta",
    "SlurmNode",
    "SlurmParseError",
    "SlurmRunner",
    "SlurmTimeoutError",
    "expand_hostlist",
    "json_meta",
    "parse_gres",
    "parse_job_ids",
    "parse_sbatch_parsable",
    "parse_scontrol_records",
    "parse_scontrol_show",
    "parse_sinfo_json",
    "parse_squeue_json",
]
