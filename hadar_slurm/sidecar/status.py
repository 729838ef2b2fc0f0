"""``hadar-slurm status`` and ``hadar-slurm explain JOBID``: what the sidecar decided, and why.

Both read Slurm live (one ``squeue --json``) and the sidecar's last epoch
(``state_dir/state.json``, written by ``hadar-slurm run``), and print text for a person
(``status --json`` for programs).  Neither changes anything.

GPU sharing (``gres/shard``, docs/sharing.md): which jobs hold shards of which GPU is read from
Slurm itself (each job's ``gres_detail``), never from the state file, so that both tell what
runs now; a job whose ``gres_detail`` cannot be read is shown as if it held no shards.  The
state file adds what the sidecar planned: its top-level ``sharing`` (``"on"``, or why sharing
is not offered), ``share`` (whether the config turned it on), ``shards`` (shards per GPU of the
nodes that have them) and each job's ``shares_with`` (the job the last decision pairs it with).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hadar_slurm.errors import InputError
from hadar_slurm.hints import is_hadar_comment, parse_hints
from hadar_slurm.sidecar.fork import copy_of
from hadar_slurm.sidecar.observe import held_by_user, launch_failed_text
from hadar_slurm.sidecar.record import JobRecord, decode
from hadar_slurm.sidecar.shard import (
    HOLDING_STATES,
    ShardError,
    asks_for_shards,
    job_gres_on,
    job_shards_on,
)
from hadar_slurm.slurm import SlurmJob, SlurmParseError
from hadar_slurm.slurm.parse import ACTIVE_STATES, PENDING_STATES

ACTIVE = ACTIVE_STATES


def _jobs_of(state: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if not state:
        return {}
    jobs = state.get("jobs")
    return jobs if isinstance(jobs, dict) else {}


def _model(info: Mapping[str, Any] | None, job: SlurmJob) -> str:
    if not is_hadar_comment(job.comment):
        return "-"
    if info:
        model, bs = info["model"], info.get("batch_size")
    else:  # not in the last epoch (finished, or new): read the hints themselves
        try:
            hints = parse_hints(job.comment)
        except InputError:
            return "(bad hints)"
        model, bs = hints.model, hints.batch_size
    return f"{model}" + (f"/bs{bs}" if bs else "")


@dataclass(frozen=True)
class Held:
    """Shards of one GPU that a job holds: ``shards`` of GPU ``gpu`` of ``node``, a GPU with
    ``total`` shards (None: neither Slurm nor the state file says how many)."""

    node: str
    gpu: int
    shards: int
    total: int | None


def _shards_of(state: Mapping[str, Any] | None) -> Mapping[str, int]:
    """Node -> shards per GPU, from the state file (``shards``; {} without one)."""
    shards = state.get("shards") if state else None
    if not isinstance(shards, dict):
        return {}
    return {str(n): c for n, c in shards.items() if isinstance(c, int) and c > 0}


def held_shards(job: SlurmJob, shards_of: Mapping[str, int] | None = None) -> list[Held]:
    """The shards ``job`` holds while it runs, by node and GPU, from its ``gres_detail`` (24.11
    and later print each GPU's shard count there; 22.05 does not, and ``shards_of`` fills it
    in).  [] for a job that holds none, or whose ``gres_detail`` cannot be read."""
    if job.state not in HOLDING_STATES:
        return []
    out: list[Held] = []
    try:
        for node in job.node_names:
            totals: dict[int, int] = {}
            for use in job_gres_on(job, node):
                if use.name == "shard":
                    totals.update(enumerate(use.totals))
            for gpu, count in sorted(job_shards_on(job, node).items()):
                total = totals.get(gpu) or (shards_of or {}).get(node) or None
                out.append(Held(node, gpu, count, total))
    except (SlurmParseError, ValueError, InputError, ShardError):
        return []
    return out


def shard_map(jobs: Sequence[SlurmJob], shards_of: Mapping[str, int] | None = None,
              ) -> tuple[dict[int, list[Held]], dict[tuple[str, int], list[tuple[int, int]]]]:
    """What every job holds as shards (job id -> :func:`held_shards`), and each GPU's holders:
    (node, GPU index) -> [(job id, shards)], by job id.  A job whose ``gres_detail`` cannot be
    read is left out (never an error: ``status`` and ``explain`` go on without it)."""
    by_job: dict[int, list[Held]] = {}
    by_gpu: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for job in sorted(jobs, key=lambda j: j.job_id):
        held = held_shards(job, shards_of)
        if held:
            by_job[job.job_id] = held
        for h in held:
            by_gpu.setdefault((h.node, h.gpu), []).append((job.job_id, h.shards))
    return by_job, by_gpu


def _jobs_text(ids: Sequence[int]) -> str:
    return f"job {ids[0]}" if len(ids) == 1 else "jobs " + ", ".join(str(i) for i in ids)


def _mates(job_id: int, held: Held,
           by_gpu: Mapping[tuple[str, int], Sequence[tuple[int, int]]]) -> list[tuple[int, int]]:
    return [(j, n) for j, n in by_gpu.get((held.node, held.gpu), ()) if j != job_id]


def _shares_text(held: Held, mates: Sequence[tuple[int, int]]) -> str:
    """``GPU 1 of node3 with job 412``: what a ``status`` row adds for a job sharing a GPU."""
    return f"GPU {held.gpu} of {held.node} with {_jobs_text([j for j, _ in mates])}"


def shard_gpus_text(job: SlurmJob, held: Sequence[Held], shards_of: Mapping[str, int],
                    rec: JobRecord) -> str:
    """The ``gpus`` cell of a job that asks for shards instead of GPUs: ``S/T`` (S shards of
    a GPU with T; ``1/2`` is half a GPU), ``Nx`` before it on N nodes, ``S shards`` where T is
    not known (22.05 with no state file, or a pending job not placed); "-" for no shards."""
    if not asks_for_shards(job):
        return "-"
    shards = sum(g.count for g in job.gres if g.name == "shard")
    total = held[0].total if held else None
    if total is None:
        node = rec.place[0][0] if rec.place and job.state in PENDING_STATES else (
            job.node_names[0] if job.node_names else "")
        total = shards_of.get(node) or None
    text = f"{shards}/{total}" if total else f"{shards} shard" + ("s" if shards > 1 else "")
    nodes = len(job.node_names)
    return f"{nodes}x{text}" if nodes > 1 else text


def status_rows(jobs: Sequence[SlurmJob], state: Mapping[str, Any] | None,
                show_all: bool = False) -> list[dict[str, str]]:
    """One row per job (active ones unless ``show_all``): where it runs and why.

    Columns: ``job``, ``name``, ``user``, ``state`` (Slurm's); ``model`` (the hints', "-" for a
    job without); ``gpus``: the GPUs the job holds or asks for over all its nodes, or, for a
    job that asks for shards of a GPU instead (``gres/shard``, GPU sharing), ``S/T``: S shards
    of a GPU that has T (``1/2``: half of one GPU), ``Nx1/2`` on N nodes, ``1 shard`` where T
    is not known; "-" for neither; ``type``: the GPU type (``*``: an estimated throughput);
    ``nodes``; ``why``: where it runs and why, or why it waits.  A running job that shares a
    GPU with another (read from Slurm) has ``; shares GPU i of NODE with job M`` added to its
    ``why``."""
    info_of = _jobs_of(state)
    unsteered = state.get("unsteered", {}) if state else {}
    dry = bool(state and state.get("dry_run"))
    shards_of = _shards_of(state)
    held_by, holders = shard_map(jobs, shards_of)
    rows: list[dict[str, str]] = []
    for job in sorted(jobs, key=lambda j: j.job_id):
        if not show_all and job.state not in ACTIVE:
            continue
        info = info_of.get(str(job.job_id))
        rec = decode(job.admin_comment)
        hadar = is_hadar_comment(job.comment)
        original = copy_of(job.comment)
        gpu_type = job.gpu_type or ("|".join(sorted(set(job.features.split("|"))))
                                    if job.features else "")
        nodes = job.nodes
        if original is not None and not _made_by_hadar(job, state):
            why = f"not a hadar job: Slurm schedules it (claims to be a copy of job {original})"
        elif original is not None:
            offset = job.het_job_offset if job.het_job_offset is not None else 0
            why = (f"copy {offset} of job {original} (HadarE: hetjob "
                   f"{job.het_job_id or job.job_id})")
        elif hadar and rec.state == "forked":
            why = _forked_text(rec)
        elif not hadar:
            why = "not a hadar job: Slurm schedules it"
        elif rec.state == "unsteered" or str(job.job_id) in unsteered:
            why = "unsteered: " + (rec.why or str(unsteered.get(str(job.job_id), "")))
        elif job.state in ("RUNNING", "CONFIGURING"):
            why = f"runs where epoch {rec.epoch} placed it" if rec.epoch >= 0 else "runs"
            if _pinned(job, state):
                why += "; never moved (preempt=never)"
        elif (failed := launch_failed_text(job, rec)) is not None:
            why = failed
        elif _user_held(job, state):
            why = "held by its user: hadar leaves it until it is released"
        elif job.state == "PENDING" and rec.state == "placed":
            why = f"placed by epoch {rec.epoch}"
            if rec.mate:
                why += (f" to share one GPU of {rec.place[0][0] if rec.place else '?'} with "
                        f"job {rec.mate}")
            why += "; Slurm starts it when its GPUs are free"
        elif info is not None:
            why = str(info.get("reason_text", ""))
            placed = [f"{n}:{c}" for n, c in info.get("placed", [])]
            if placed and dry:
                # shadow mode: nothing was placed in Slurm; say where it would have been
                why = f"dry run: would be placed on {', '.join(placed)}"
                if info.get("shares_with"):
                    why += f", sharing one GPU with job {info['shares_with']}"
                gpu_type = gpu_type or str(info.get("gpu_type", ""))
                nodes = nodes or ",".join(n for n, _ in info.get("placed", []))
            if info.get("detail"):
                why += f" ({info['detail']})"
        elif job.state == "PENDING":
            why = "waits for the sidecar's next epoch"
        else:
            why = job.state.lower()
        held = held_by.get(job.job_id, [])
        for h in held:
            mates = _mates(job.job_id, h, holders)
            if mates:
                why += "; shares " + _shares_text(h, mates)
        rows.append({
            "job": str(job.job_id), "name": job.name, "user": job.user, "state": job.state,
            "model": _model(info, job), "gpus": str(job.gpus_per_node * max(
                1, len(job.node_names))) if job.gpus_per_node else shard_gpus_text(
                    job, held, shards_of, rec),
            "type": (gpu_type or "-") + (ESTIMATE_MARK if _estimated(info, gpu_type) else ""),
            "nodes": nodes or "-", "why": why,
        })
    return rows


PINNED_TEXT = (
    "runs where epoch {epoch} placed it, and stays there until it ends: its hints do not let "
    "hadar stop it (preempt=never, the default). Add preempt=checkpoint (it saves its state on "
    "the signal and exits 75) or preempt=requeue (it may be restarted) to let hadar move it to "
    "faster GPUs")


def _listed(key: str, job: SlurmJob, state: Mapping[str, Any] | None) -> bool | None:
    """Whether the last epoch listed ``job`` under ``key`` (None: no such list)."""
    ids = state.get(key) if state else None
    return job.job_id in ids if isinstance(ids, list) else None


def _made_by_hadar(job: SlurmJob, state: Mapping[str, Any] | None) -> bool:
    """A job commented ``hadar-copy-of=J`` is one of J's copies only if the sidecar made it
    (the last epoch lists it; a state file without the list trusts the comment)."""
    listed = _listed("copy_jobs", job, state)
    return listed is None or listed


def _pinned(job: SlurmJob, state: Mapping[str, Any] | None) -> bool:
    return bool(_listed("pinned", job, state))


def _user_held(job: SlurmJob, state: Mapping[str, Any] | None) -> bool:
    return bool(_listed("user_held", job, state)) or held_by_user(job)


#: After a GPU type in ``status``: the job's throughput there is an estimate, not a measurement.
ESTIMATE_MARK = "*"


def _estimated(info: Mapping[str, Any] | None, gpu_type: str) -> bool:
    """Whether the throughput the sidecar planned ``gpu_type`` with is an estimate."""
    if not info or not gpu_type:
        return False
    sources = info.get("rate_sources") or {}
    return any(sources.get(t) == "estimated" for t in gpu_type.split("|"))


def _forked_text(rec: JobRecord) -> str:
    nodes = ", ".join(n for n, _ in rec.place) or "?"
    return (f"forked into {rec.copies} copies as hetjob {rec.group} on {nodes}; waits, held, "
            "until they end")


def format_status(jobs: Sequence[SlurmJob], state: Mapping[str, Any] | None,
                  show_all: bool = False) -> str:
    lines = []
    if state:
        age = time.time() - float(state.get("time", 0.0))
        mode = " (dry run: nothing was changed)" if state.get("dry_run") else ""
        slurm = f", Slurm {state['slurm_version']}" if state.get("slurm_version") else ""
        lines.append(f"last epoch {state.get('epoch')} ({age:.0f} s ago), policy "
                     f"{state.get('policy')}{mode}{slurm}")
    else:
        lines.append("the sidecar has not run an epoch yet (no state file)")
    rows = status_rows(jobs, state, show_all)
    cols = ["job", "name", "user", "state", "model", "gpus", "type", "nodes", "why"]
    if not rows:
        lines.append("no jobs")
        return "\n".join(lines)
    width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols[:-1]}
    lines.append("  ".join(c.upper().ljust(width[c]) for c in cols[:-1]) + "  WHY")
    for r in rows:
        lines.append("  ".join(r[c][:40].ljust(width[c]) for c in cols[:-1]) + "  " + r["why"])
    if any(r["type"].endswith(ESTIMATE_MARK) for r in rows):
        lines.append(f"{ESTIMATE_MARK} the job's throughput on that GPU type is an estimate (never "
                     "measured; see `hadar-slurm explain JOBID`)")
    lines.extend(study_lines(state, show_all))
    return "\n".join(lines)


def study_lines(state: Mapping[str, Any] | None, show_all: bool = False) -> list[str]:
    """The tuning studies of the last epoch (issue #17), rung by rung: how many trials reported
    there, went on, were stopped, wait for their cohort or were lost, the best report of the
    rung, and the study's best trial so far with its configuration.  Studies that ended are
    shown with ``--all`` only."""
    studies = state.get("studies") if state else None
    if not isinstance(studies, list):
        return []
    out: list[str] = []
    for s in studies:
        if not isinstance(s, dict) or (s.get("ended") is not None and not show_all):
            continue
        ended = "ended" if s.get("ended") is not None else f"{s.get('live')} live"
        out.append(f"study {s.get('name')} (array {s.get('array')}, {s.get('user')}): "
                   f"{s.get('rule')}, {s.get('rungs')} rungs, eta {s.get('eta')}, "
                   f"{s.get('metric')} ({s.get('mode')}); {s.get('trials')} trials, {ended}")
        for r in s.get("by_rung") or []:
            parts = [f"{r.get('reported')} reported"]
            parts += [f"{r.get(k)} {w}" for k, w in (("go", "went on"), ("stop", "stopped"),
                                                    ("wait", "wait"), ("done", "done"),
                                                    ("lost", "lost")) if r.get(k)]
            best = r.get("best")
            out.append(f"  rung {r.get('rung')} ({r.get('steps')} steps): {', '.join(parts)}"
                       + (f"; best {best:.4g}" if isinstance(best, int | float) else ""))
        best = s.get("best")
        if isinstance(best, dict):
            config = best.get("config")
            out.append(f"  {'best' if best.get('final') else 'best so far'}: trial "
                       f"{best.get('task')} (job {best.get('job')}), {s.get('metric')} "
                       f"{best.get('value'):.4g} at rung {best.get('rung')}"
                       + (f", config {json.dumps(config, sort_keys=True)}" if config else ""))
    return out


def explain(job_id: int, jobs: Sequence[SlurmJob], state: Mapping[str, Any] | None) -> str:
    """Why ``job_id`` waits, or runs where it does, in a few lines."""
    job = next((j for j in jobs if j.job_id == job_id), None)
    if job is None:
        raise InputError(f"Slurm does not know job {job_id} (finished jobs stay visible for "
                         "MinJobAge seconds only)", field="JOBID")
    head = f"job {job.job_id} ({job.name}, user {job.user}): {job.state}"
    if job.node_names:
        head += f" on {job.nodes}"
    out = [head]
    original = copy_of(job.comment)
    if original is not None and not _made_by_hadar(job, state):
        out.append(f"not a hadar job: its comment says it is a copy of job {original}, but hadar "
                   "did not make it (another owner, script, or job id); the sidecar leaves it to "
                   "Slurm and only counts the GPUs it holds")
        return "\n".join(out)
    if original is not None:
        offset = job.het_job_offset if job.het_job_offset is not None else 0
        out.append(f"copy {offset} of job {original}, forked by hadar (HadarE): component "
                   f"{offset} of hetjob {job.het_job_id or job.job_id}; `hadar-slurm explain "
                   f"{original}` tells about the job and all its copies")
        return "\n".join(out)
    if not is_hadar_comment(job.comment):
        out.append("not a hadar job (its comment has no 'hadar:' hints): the sidecar leaves it "
                   "to Slurm and only counts the GPUs it holds")
        return "\n".join(out)
    out.append(f"hints: {job.comment.strip()}")
    rec = decode(job.admin_comment)
    if rec.state == "unsteered":
        out.append(f"released to Slurm's own scheduler (unsteered): {rec.why}")
        return "\n".join(out)
    info = _jobs_of(state).get(str(job_id))
    if state is None:
        out.append("the sidecar has not run an epoch yet (no state file)")
    elif (failed := launch_failed_text(job, rec)) is not None:
        out.append(failed)
    elif _user_held(job, state):
        out.append("held by its user (sbatch --hold, or scontrol hold after hadar placed it): "
                   "hadar leaves it alone until it is released (scontrol release "
                   f"{job.job_id})")
    elif info is None and _pinned(job, state):
        out.append(PINNED_TEXT.format(epoch=rec.epoch))
    elif info is None:
        if job.state not in ACTIVE:
            where = ", ".join(f"{n}:{c}" for n, c in rec.place) or job.nodes or "-"
            out.append(f"finished ({job.state.lower()}); the sidecar last placed it in epoch "
                       f"{rec.epoch} on {where}" if rec.decided else
                       f"finished ({job.state.lower()})")
        else:
            out.append(f"not in the sidecar's last epoch ({state.get('epoch')}): it arrived "
                       "after it")
    else:
        age = time.time() - float(state.get("time", 0.0))
        where = ", ".join(f"{n}:{c}" for n, c in info.get("placed", []))
        verdict = (f"placed on {where} ({info.get('gpu_type')})" if where
                   else str(info.get("reason_text")))
        if where and info.get("shares_with"):
            verdict += f", sharing one GPU with job {info['shares_with']}"
        if int(info.get("copies", 0)) >= 2:
            verdict = f"forked into {info['copies']} copies, on {where} ({info.get('gpu_type')})"
        out.append(f"epoch {state.get('epoch')} ({age:.0f} s ago, policy {state.get('policy')}):"
                   f" {verdict} [decided by {info.get('component')}]")
        spread = info.get("placed", [])
        if len(spread) > 1 and int(info.get("copies", 0)) < 2:
            per = {int(c) for _, c in spread}
            out.append(f"  on {len(spread)} nodes: its request is rewritten to --nodes="
                       f"{len(spread)} --gres=gpu:{per.pop() if len(per) == 1 else '?'} (the job "
                       f"sees SLURM_JOB_NUM_NODES={len(spread)} and SLURM_JOB_NODELIST)")
        if info.get("detail"):
            out.append(f"  note: {info['detail']}")
        study = info.get("study")
        if isinstance(study, Mapping) and study.get("detail"):
            out.append(f"study: {study['detail']}")
            if study.get("weight") is not None and int(study.get("offered") or 0) > 0:
                out.append(f"  weighs {float(study['weight']):g} in the policy's order: its "
                           f"study's {int(study.get('trials') or 0)} trial(s) over the "
                           f"{int(study['offered'])} offered this epoch (a study keeps its "
                           "weight as its trials are stopped)")
        if info.get("pinned") or _pinned(job, state):
            out.append("  " + PINNED_TEXT.format(epoch=rec.epoch))
        rates: Mapping[str, float] = info.get("rates", {})
        sources: Mapping[str, str] = info.get("rate_sources", {})
        best = max(rates.values(), default=0.0)
        if best > 0:
            speed = ", ".join(
                f"{t} {r:.3g} it/s ({r / best:.2f}x"
                + (f", {sources[t]}" if sources.get(t) not in (None, "", "table") else "") + ")"
                for t, r in sorted(rates.items(), key=lambda kv: -kv[1]))
            out.append(f"throughput of {info.get('job_type')} on {info.get('gpus')} GPU(s): "
                       f"{speed}")
            if "estimated" in sources.values():
                out.append("  estimated: never measured on that GPU type; estimated from the "
                           "rest of the table until a run or `hadar-slurm profile` measures it")
        out.extend(_fork_lines(job, rec, info, jobs))
        progress = info.get("progress")
        if isinstance(progress, Mapping):
            out.append(f"progress (from the job tracker's progress.json): {progress.get('done'):g}"
                       f" of {info.get('steps')} iterations, {progress.get('rounds')} rounds"
                       + (" (complete)" if progress.get("complete") else ""))
            rates = progress.get("rates") or {}
            types = progress.get("gpu_types") or {}
            if rates:
                out.append("  copies' rates (last round): " + ", ".join(
                    f"copy {c}" + (f" ({types[c]})" if c in types else "") + f" {r:.4g} it/s"
                    for c, r in sorted(rates.items(), key=lambda kv: int(kv[0]))))
        else:
            out.append(f"progress (estimated from the throughput table): {info.get('done_est')}"
                       f" of {info.get('steps')} steps; about {info.get('remaining_est')} to go")
    if info is None:
        out.extend(_fork_lines(job, rec, {}, jobs))
    out.extend(_sharing_lines(job, rec, info, jobs, state))
    if rec.decided:
        out.append(f"record in Slurm (AdminComment): {job.admin_comment}")
    if job.state == "PENDING" and rec.state == "placed":
        out.append(f"Slurm's pending reason: {job.state_reason} (it starts the job on "
                   f"{', '.join(n for n, _ in rec.place)} when those GPUs are free)")
    return "\n".join(out)


def _fork_lines(job: SlurmJob, rec: JobRecord, info: Mapping[str, Any],
                jobs: Sequence[SlurmJob]) -> list[str]:
    """What explain says about a job's copies (HadarE), from Slurm itself: the components
    commented ``hadar-copy-of=JOB``, the newest fork first."""
    out: list[str] = []
    comps = [j for j in jobs if copy_of(j.comment) == job.job_id]
    leaders = sorted({c.het_job_id or c.job_id for c in comps}, reverse=True)
    for k, leader in enumerate(leaders):
        group = sorted((c for c in comps if (c.het_job_id or c.job_id) == leader),
                       key=lambda c: c.het_job_offset or 0)
        where = ", ".join(f"{c.node_names[0] if c.node_names else c.required_nodes or '?'} "
                          f"({c.features or '?'})" for c in group)
        states = "/".join(sorted({c.state.lower() for c in group}))
        if k == 0:
            line = f"forked into {len(group)} copies as hetjob {leader} on {where} ({states})"
            if job.state == "PENDING" and rec.state == "forked":
                line += ("; the job itself waits, held, until they end (Dependency "
                         f"{job.dependency or '-'})")
            out.append(line)
        else:
            out.append(f"  earlier fork: hetjob {leader} on {where} ({states})")
    if not leaders and rec.state == "forked":
        out.append(_forked_text(rec))
    if info.get("fork_blocked"):
        out.append(f"not forked: {info.get('fork_blocked')}")
    elif int(info.get("max_copies", 1)) > 1 and rec.state != "forked":
        out.append(f"may be forked into up to {info.get('max_copies')} copies (hint fork)")
    return out


def _sharing_lines(job: SlurmJob, rec: JobRecord, info: Mapping[str, Any] | None,
                   jobs: Sequence[SlurmJob], state: Mapping[str, Any] | None) -> list[str]:
    """What explain says about GPU sharing: the shards the job holds and who holds the GPU's
    others (from Slurm: every job's ``gres_detail``), the partner its record names while it
    waits to start beside it, its ``share=no`` hint, or (a 1-GPU job, nothing else to say)
    why the sidecar does not offer sharing at all.  Never raises on text it cannot read."""
    out: list[str] = []
    shards_of = _shards_of(state)
    if held_shards(job, shards_of):
        held_by, holders = shard_map(jobs, shards_of)
        for h in held_by.get(job.job_id, []):
            mates = _mates(job.job_id, h, holders)
            if mates:
                counts = [h.shards, *(n for _, n in mates)]
                each = ("one shard each" if set(counts) == {1} else
                        f"shards: this job {h.shards}, "
                        + ", ".join(f"job {j} {n}" for j, n in mates))
                out.append(f"sharing {_shares_text(h, mates)} ({each})")
            elif h.total is not None and h.shards < h.total:
                out.append(f"runs alone on GPU {h.gpu} of {h.node} as a shard job (another job "
                           "may join it)")
            elif h.total is not None:
                out.append(f"runs alone on GPU {h.gpu} of {h.node} as a shard job, on all "
                           f"{h.total} of its shards")
            else:
                out.append(f"runs alone on GPU {h.gpu} of {h.node} as a shard job "
                           f"({h.shards} shard{'s' if h.shards > 1 else ''})")
    if not out and job.state in PENDING_STATES and rec.state == "placed" and rec.mate:
        node = rec.place[0][0] if rec.place else "?"
        out.append(f"placed to share one GPU of {node} with job {rec.mate} (one shard each)")
    try:
        share = parse_hints(job.comment).share
    except InputError:
        share = True
    if not share:
        out.append("never shares a GPU (hint share=no)")
    elif not out and job.state in ACTIVE and state and state.get("share") is not False:
        why = state.get("sharing")
        gpus = info.get("gpus") if info else job.gpus_per_node
        if isinstance(why, str) and why and why != "on" and gpus == 1 and len(
                job.node_names) <= 1:
            if why.startswith("off (") and why.endswith(")"):
                why = why[len("off ("):-1]
            out.append(f"GPU sharing: off ({why})")
    return out
