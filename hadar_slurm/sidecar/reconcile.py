"""Reconcile: what Slurm must change so that it runs a decision, as data.

:func:`reconcile` is pure: from what the sidecar observed (:class:`Observed`, built by
:mod:`hadar_slurm.sidecar.observe` from one read of jobs and nodes) and the policy's
:class:`~hadar_slurm.policy.base.Decision`, it lists the :class:`~hadar_slurm.loop.Change` of
every job, in the order they are applied (:mod:`hadar_slurm.sidecar.apply` executes them):

1. ``REQUEUE``: jobs a move left ended (failed in their grace period) are requeued held;
2. ``UNSTEER``: jobs the sidecar will not steer go to Slurm's own scheduler, with the reason;
   ``CANCEL``: trials their study stopped (below);
3. ``KEEP``: jobs already where the decision wants them (a running job; a fork whose copies
   run or wait as the decision's; a pending job already placed there, whose release a crash may
   have left undone);
4. ``STOP``/``MOVE`` (running jobs the decision stops or moves: checkpoint signal, grace period,
   requeue held; a moved job is placed on its new GPUs as soon as Slurm has requeued it, in the
   same epoch) and ``END_FORK`` (copies that end: signal, grace, cancel), which share one grace
   period;
5. ``PLACE`` and ``FORK`` for pending jobs;
6. ``WAIT`` for pending jobs without GPUs this epoch.

A study's trial that its study does not offer to the policy this epoch
(:class:`~hadar_slurm.sidecar.studies.TrialStatus`) is not the decision's: one that waits for
its cohort is stopped (``STOP``, or ``END_FORK`` of its copies) or kept waiting (``WAIT``); one
its halving rule stopped is ``CANCEL``-led when the book says so (pending, or still running an
epoch after it was told), and otherwise left to exit by itself (``KEEP``).

Where the decision cannot be carried out as it stands, the change says so in ``why``: a
placement over nodes with unequal GPU counts (one Slurm job cannot express it) waits; a fork of
a job that cannot be forked is placed unforked on copy 0's GPUs (``nofork``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hadar_slurm.loop import Change, ChangeKind, Rows, even
from hadar_slurm.policy.base import Decision
from hadar_slurm.sidecar.observe import JobView, Observed, rows_text


def reconcile(observed: Observed, decision: Decision,
              reasons: Mapping[int, str] | None = None) -> list[Change]:
    """The changes that make Slurm run ``decision`` (see the module's docstring).
    ``reasons``: by job id, why the policy did not place it (what a ``STOP`` says)."""
    epoch = decision.epoch
    wanted = decision.placement.by_job_copies()
    mates = _mates(observed, decision, wanted)
    first: list[Change] = [Change(epoch, ChangeKind.REQUEUE, j.job_id,
                                  why="it ended during a move without being requeued")
                           for j in observed.moves_left]
    first += [Change(epoch, ChangeKind.UNSTEER, u.job.job_id, why=u.why)
              for u in observed.unsteered]
    keep: list[Change] = []
    stop: list[Change] = [Change(epoch, ChangeKind.END_FORK, e.group.original, why=e.why,
                                 group=e.group.leader) for e in observed.orphans]
    start: list[Change] = []
    wait: list[Change] = []
    for view in observed.views.values():
        job_id = view.job_id
        trial = view.study
        if trial is not None and not trial.offered:
            if trial.state == "stopped" and trial.cancel:
                first.append(Change(epoch, ChangeKind.CANCEL, job_id, why=trial.detail))
            if view.group is not None:
                stop.append(Change(epoch, ChangeKind.END_FORK, job_id, why=trial.detail,
                                   group=view.group.leader))
            elif trial.state == "stopped":
                if not trial.cancel:
                    keep.append(Change(epoch, ChangeKind.KEEP, job_id,
                                       (view.rows,) if view.running else (),
                                       why=trial.detail + "; it exits by itself"))
            elif view.running:
                stop.append(Change(epoch, ChangeKind.STOP, job_id, why=trial.detail))
            else:
                wait.append(Change(epoch, ChangeKind.WAIT, job_id, why=trial.detail))
            continue
        copies = wanted.get(job_id)
        cps: tuple[Rows, ...] = () if copies is None else tuple(
            tuple(sorted(copies[k])) for k in sorted(copies))
        replaces = 0
        if view.group is not None:
            if len(cps) >= 2 and _same_copies(view, cps):
                keep.append(Change(epoch, ChangeKind.KEEP, job_id, cps, group=view.group.leader))
                continue
            stop.append(Change(epoch, ChangeKind.END_FORK, job_id, why=_end_why(cps),
                               group=view.group.leader))
            replaces = view.group.leader
        elif view.running:
            if (len(cps) == 1 and view.record.state != "preempting"
                    and not even(cps[0])):
                # the decision moves it where one Slurm job cannot run: it stays where it is
                keep.append(Change(epoch, ChangeKind.KEEP, job_id, (view.rows,),
                                   why=_uneven(cps[0], observed.node_names) + "; it stays "
                                   "where it runs"))
            elif view.record.state == "preempting" or not cps or len(cps) >= 2 or (
                    view.rows != cps[0]):
                # a move (or one begun before a restart): stopped, then placed on its new
                # GPUs in the same epoch once Slurm has requeued it
                if len(cps) >= 2 and view.fork_blocked:
                    stop.append(Change(epoch, ChangeKind.MOVE, job_id, cps[:1],
                                       why=f"not forked: {view.fork_blocked}", nofork=True))
                elif cps:
                    stop.append(Change(epoch, ChangeKind.MOVE, job_id, cps,
                                       why="the decision moves it"))
                else:
                    why = (reasons or {}).get(job_id, "")
                    stop.append(Change(epoch, ChangeKind.STOP, job_id,
                                       why="the decision stops it" + (
                                           f" ({why})" if why else "")))
            else:
                keep.append(Change(epoch, ChangeKind.KEEP, job_id, cps))
            continue
        mate = mates.get(job_id, 0)
        if not cps:
            change = Change(epoch, ChangeKind.WAIT, job_id)
        elif mate < 0:
            change = Change(epoch, ChangeKind.WAIT, job_id, why=(
                f"the decision shares its GPU with job {-mate}, which Slurm cannot do here "
                f"({_unpairable(view, observed.views.get(-mate), cps)}); it waits"))
        elif len(cps) == 1:
            change = _place(epoch, view, cps[0], observed.node_names, mate=mate)
        elif view.fork_blocked:
            change = _place(epoch, view, cps[0], observed.node_names,
                            why=f"not forked: {view.fork_blocked}", nofork=True)
        elif not (view.held or view.parked):
            # released by an earlier epoch and not started yet: held now, forked next epoch
            change = Change(epoch, ChangeKind.WAIT, job_id,
                            why="held before it is forked (it was released, not started)")
        else:
            change = Change(epoch, ChangeKind.FORK, job_id, cps, group=replaces)
        if change.kind is ChangeKind.KEEP:
            keep.append(change)
        else:
            (wait if change.kind is ChangeKind.WAIT else start).append(change)
    return first + keep + stop + start + wait


def _place(epoch: int, view: JobView, rows: Rows, node_names: Sequence[str], *,
           why: str = "", nofork: bool = False, mate: int = 0) -> Change:
    """PLACE ``view`` on ``rows`` (beside ``mate`` on its GPU, when given), KEEP when its
    record already places it there, or WAIT when one Slurm job cannot express ``rows``
    (unequal GPU counts per node)."""
    if not even(rows):
        return Change(epoch, ChangeKind.WAIT, view.job_id, why=(
            _uneven(rows, node_names) + "; it waits for an even placement"))
    place = rows_text(node_names, rows)
    rec = view.record
    if rec.state == "placed" and rec.place == place and rec.mate == mate and not why:
        return Change(epoch, ChangeKind.KEEP, view.job_id, (rows,), mate=mate)
    return Change(epoch, ChangeKind.PLACE, view.job_id, (rows,), why=why, nofork=nofork,
                  mate=mate)


def _mates(observed: Observed, decision: Decision,
           wanted: Mapping[int, Mapping[int, list[tuple[int, int]]]]) -> dict[int, int]:
    """The pending jobs the decision puts beside another job on one GPU (``Decision.packed``),
    with that job: its id where Slurm can do it (both wait and are placed on the same one GPU,
    or the other runs alone on that GPU's shards), minus its id where it cannot (the job then
    waits; of two pending jobs, the later one), and nothing for a pair that runs already
    (both are kept where they are, or moved, as any job)."""
    out: dict[int, int] = {}
    for a, b in decision.packed:
        va, vb = observed.views.get(a), observed.views.get(b)
        if va is None or vb is None:
            continue  # (a job of the pair is not steered: each is placed as decided alone)
        if va.running and vb.running:
            continue
        rows_a = tuple(sorted(wanted.get(a, {}).get(0, ())))
        rows_b = tuple(sorted(wanted.get(b, {}).get(0, ())))
        waiting, other = (vb, va) if va.running or (not vb.running and a < b) else (va, vb)
        ok = (rows_a == rows_b and len(rows_a) == 1 and rows_a[0][1] == 1
              and len(wanted.get(a, {})) == 1 and len(wanted.get(b, {})) == 1
              and waiting.group is None and other.group is None
              and (not other.running or (other.shard_gpu is not None and not other.mate
                                         and other.rows == rows_a)))
        if ok:
            out[waiting.job_id] = other.job_id
            if not other.running:
                out[other.job_id] = waiting.job_id
        else:
            out[waiting.job_id] = -other.job_id
    return out


def _unpairable(view: JobView, other: JobView | None, copies: Sequence[Rows]) -> str:
    """Why the sidecar cannot put ``view`` beside ``other`` on one GPU."""
    if other is None:
        return "that job is not steered"
    if len(copies) != 1 or len(copies[0]) != 1 or copies[0][0][1] != 1:
        return "only two 1-GPU jobs share a GPU through Slurm's shards"
    if view.group is not None or other.group is not None:
        return "a forked job's copies do not share"
    if other.running and other.shard_gpu is None:
        return "it holds its GPU whole, and Slurm adds no job to a GPU given whole"
    if other.running and other.mate:
        return f"its GPU is shared with job {other.mate} already"
    return "they are not placed on the same GPU"


def _uneven(rows: Rows, node_names: Sequence[str]) -> str:
    place = rows_text(node_names, rows)
    return ("placed across nodes with unequal GPU counts "
            f"({', '.join(f'{n}:{c}' for n, c in place)}), which one Slurm job cannot express")


def _same_copies(view: JobView, copies: Sequence[Rows]) -> bool:
    """Whether ``view``'s copies run (or wait) exactly as ``copies`` (copy numbers aside)."""
    want = sorted(tuple(sorted((int(k), int(c)) for k, c in rows)) for rows in copies)
    return view.copy_rows() == want


def _end_why(copies: Sequence[Rows]) -> str:
    if not copies:
        return "the decision stops it"
    if len(copies) == 1:
        return "the decision runs it unforked"
    return f"the decision moves it to {len(copies)} other copies"
