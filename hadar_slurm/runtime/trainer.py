"""The training side of the runtime (needs torch): :class:`JobRuntime` and the averaging.

See :mod:`hadar_slurm.runtime` for the protocol and the files.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, TypeVar

import torch

from hadar_slurm.errors import InputError
from hadar_slurm.rates.memory import CONTEXT_MIB, MIB
from hadar_slurm.runtime.config import (
    EXIT_COPY_LOST,
    EXIT_PREEMPTED,
    AlreadyDone,
    CopyLost,
    JobStop,
    Preempted,
    RuntimeConfig,
    signal_number,
)
from hadar_slurm.runtime.tracker import (
    FORMAT,
    CommittedState,
    TrackerPaths,
    atomic_write_bytes,
    atomic_write_json,
    now,
    plan_round,
    read_json,
)

__all__ = ["JobRuntime", "RunSummary", "pick_device", "weighted_average"]

T = TypeVar("T")
_LOW_PRECISION = (torch.float16, torch.bfloat16)
#: Longest pause between two looks at the tracker files while waiting at a barrier (a few
#: stat() calls each): short, since every copy waits this long again at each round's end.
_MAX_POLL_S = 0.01
#: How long a copy that has sent no heartbeat at all in this run may take to start, at least.
_STARTUP_GRACE_S = 120.0


# ----------------------------------------------------------------------------------- averaging

class _Leaf:
    """Running weighted sum of one floating tensor; for anything else (integers, counters,
    hyper-parameters, None) the value of the copy with the largest weight."""

    __slots__ = ("best", "best_weight", "dtype", "floating", "sum", "total")

    def __init__(self) -> None:
        self.sum: torch.Tensor | None = None
        self.total = 0.0
        self.dtype: torch.dtype | None = None
        self.floating = True
        self.best: object = None
        self.best_weight = -math.inf

    def add(self, value: object, weight: float, where: str) -> None:
        if weight > self.best_weight:
            self.best, self.best_weight = value, weight
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            self.floating = False
            return
        if not self.floating:
            return
        acc_dtype = torch.float32 if value.dtype in _LOW_PRECISION else value.dtype
        term = value.detach().to(device="cpu", dtype=acc_dtype) * weight
        if self.sum is None:
            self.sum, self.dtype = term, value.dtype
        elif self.sum.shape != term.shape:
            raise ValueError(f"{where}: shape {tuple(term.shape)} in one copy and "
                             f"{tuple(self.sum.shape)} in another")
        else:
            self.sum += term.to(self.sum.dtype)
        self.total += weight

    def result(self) -> object:
        if not self.floating or self.sum is None or self.total <= 0:
            return self.best
        assert self.dtype is not None
        return (self.sum / self.total).to(self.dtype)


class _Averager:
    """Weighted average of nested state dicts (a model's or an optimizer's), added one at a
    time so that only one copy's state is in memory besides the running sums."""

    def __init__(self) -> None:
        self._tree: object = None
        self.count = 0

    def add(self, state: object, weight: float) -> None:
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"weights must be positive, got {weight!r}")
        self._tree = self._add(self._tree, state, float(weight), "state")
        self.count += 1

    def _add(self, node: object, value: object, weight: float, where: str) -> object:
        if isinstance(value, Mapping):
            if node is None:
                node = {}
            if not isinstance(node, dict):
                raise ValueError(f"{where}: a mapping in one copy, not in another")
            for key, item in value.items():
                node[key] = self._add(node.get(key), item, weight, f"{where}[{key!r}]")
            return node
        if isinstance(value, list | tuple):
            if node is None:
                node = (type(value), [None] * len(value))
            if not (isinstance(node, tuple) and len(node[1]) == len(value)):
                raise ValueError(f"{where}: sequences of different lengths in the copies")
            for k, item in enumerate(value):
                node[1][k] = self._add(node[1][k], item, weight, f"{where}[{k}]")
            return node
        leaf = _Leaf() if node is None else node
        if not isinstance(leaf, _Leaf):
            raise ValueError(f"{where}: a container in one copy, a value in another")
        leaf.add(value, weight, where)
        return leaf

    def result(self) -> Any:
        if self.count == 0:
            raise ValueError("nothing to average")
        return self._result(self._tree)

    def _result(self, node: object) -> object:
        if isinstance(node, dict):
            return {key: self._result(item) for key, item in node.items()}
        if isinstance(node, tuple):
            kind, items = node
            out = [self._result(item) for item in items]
            return out if kind is list else kind(out)
        assert isinstance(node, _Leaf)
        return node.result()


def weighted_average(states: Sequence[Mapping[str, Any]], weights: Sequence[float]) -> Any:
    """The weighted average of ``states`` (model or optimizer state dicts, nested dicts and
    lists allowed): every floating-point tensor becomes ``sum(w_i * t_i) / sum(w_i)`` in its own
    dtype (accumulated in float32 for 16-bit types), on the CPU; everything else (integer
    buffers such as BatchNorm's ``num_batches_tracked``, hyper-parameters) is taken from the
    state with the largest weight (the first one on a tie).  States with weight 0 are left out;
    negative weights and an all-zero list are errors."""
    if len(states) != len(weights):
        raise ValueError(f"{len(states)} states but {len(weights)} weights")
    if any(w < 0 or not math.isfinite(w) for w in weights):
        raise ValueError(f"weights must be finite and >= 0, got {list(weights)}")
    averager = _Averager()
    for state, weight in zip(states, weights, strict=True):
        if weight > 0:
            averager.add(state, weight)
    if averager.count == 0:
        raise ValueError("all weights are zero")
    return averager.result()


# ----------------------------------------------------------------------------------- helpers

def pick_device(config: RuntimeConfig) -> torch.device:
    """``HADAR_DEVICE`` (config.device) when given, else CUDA when available, else the CPU."""
    if config.device:
        return torch.device(config.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _save_torch(path: Path, obj: object, *, durable: bool) -> None:
    """torch.save to ``path`` atomically (temporary file in the same folder, then replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as out:
            torch.save(obj, out)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _load_torch(path: Path, device: torch.device | str) -> dict[str, Any]:
    obj = torch.load(path, map_location=device, weights_only=True)
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: not a hadar checkpoint")
    return obj


@dataclass(frozen=True)
class RunSummary:
    """What :meth:`JobRuntime.finish` returns."""

    work: int
    done: int
    rounds: int
    complete: bool
    stopped: str | None  # "time limit", "signal USR1", ... or None
    executed: int  # iterations this process ran (some may be lost, see the module docs)
    seconds: float  # wall time in steps()
    output: Path | None  # where the consolidated model was written (copy 0 only)


@dataclass
class _Report:
    copy: int
    iters: int
    seconds: float
    stop: str | None
    gpu_type: str | None
    nonce: str
    #: the most GPU memory this copy held, MiB (CUDA only: torch's peak reservation plus a
    #: context; None on the CPU), what the sidecar learns as the job's footprint
    gpu_mem_mib: float | None = None


# ----------------------------------------------------------------------------------- runtime

class JobRuntime:
    """One copy of a HadarE job (or an unforked job) training ``model`` with ``optimizer``.

    Creating it joins the job: it loads the committed state (the consolidated model, optimizer
    state and iterations done) from the tracker dir, so a requeued or re-forked job resumes
    where the last commit left it; on a fresh job with several copies, copy 0 commits its
    initial model first so that all copies start from the same parameters.  The model is moved
    to :attr:`device`.  Then::

        with JobRuntime(model, optimizer, config, output="model.pt") as rt:
            for step in rt.steps():
                ...  # one training iteration
            summary = rt.finish()

    ``steps()`` yields once per iteration this copy must run and handles the rounds (report,
    barrier, consolidation) between them; :attr:`round` and :attr:`copy_index` tell the loop
    which data to draw.  When the job's work is already done at start, the output model is
    (re)written if missing and :class:`AlreadyDone` (exit 0) is raised, unless
    ``exit_if_done=False`` (then ``steps()`` yields nothing).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        config: RuntimeConfig,
        *,
        output: str | os.PathLike[str] | None = None,
        exit_if_done: bool = True,
        log: IO[str] | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.config = config
        self.output = None if output is None else Path(output)
        self.paths = TrackerPaths(config.tracker_dir)
        self.device = pick_device(config)
        self.round = 0
        self.stopped: str | None = None
        self._log = log if log is not None else sys.stdout
        self._host = socket.gethostname()
        self._started = now()
        self._executed = 0
        self._beats = 0
        self._last_beat = -math.inf
        self._phase = "starting"
        self._signals: list[str] = []
        self._old_handlers: dict[int, Any] = {}
        self._deadline: float | None = None
        self._t_steps: float | None = None
        self._seconds = 0.0
        self._run_rounds = 0  # rounds this run (this process's group of copies) committed
        self._closed = False
        self._label = (f"job {config.job_key}" if config.copies == 1
                       else f"job {config.job_key} copy {config.index}/{config.copies}")

        model.to(self.device)
        config.tracker_dir.mkdir(parents=True, exist_ok=True)
        self._install_signals()
        self._beat("starting", force=True)
        try:
            self._state = self._join()
        except BaseException as exc:
            self._leave(exc)
            raise
        if self._state.complete:
            self._say(f"work already done ({self._state.done}/{config.work} iterations, "
                      f"round {self._state.round})")
            self._write_output(only_if_missing=True)
            if exit_if_done:
                done = AlreadyDone(f"hadar: {self._label}: work already done")
                self._leave(done)
                raise done

    # -------------------------------------------------------------------- public
    @property
    def copy_index(self) -> int:
        return self.config.index

    @property
    def copies(self) -> int:
        return self.config.copies

    @property
    def done(self) -> int:
        """Iterations committed so far (all copies, all runs)."""
        return self._state.done

    @property
    def state(self) -> CommittedState:
        """The last committed state this copy has seen."""
        return self._state

    def stop_requested(self) -> bool:
        """Whether the copies stop at the next iteration (a preemption signal came, or the
        time limit passed): a caller waiting between rounds (a study's trial waiting for its
        verdict) ends its wait, and :meth:`steps` then stops and exits as it says."""
        return self.stopped is not None or self._stop_reason() is not None

    def steps(self, until: int | None = None) -> Iterator[int]:
        """Yield once per iteration this copy must run, until the job's work is done (or a
        time limit / preemption stops the copies at a round boundary).  The value is the
        committed total at the start of the round plus this copy's iterations in it (exact
        global step for an unforked job).  Raises :class:`Preempted` (exit 75) after a
        preemption signal and :class:`CopyLost` (exit 76) when a copy it needs is gone.

        ``until``: stop once the committed total reaches ``until`` iterations (of the work):
        the rounds are cut so that one commits exactly there, which is then the checkpoint
        (a study's trial trains to a rung, reports and waits, :mod:`hadar_slurm.studies.
        reporter`).  Every copy must pass the same ``until``; it can be called again with a
        later one."""
        cfg = self.config
        target = cfg.work if until is None else max(0, min(int(until), cfg.work))
        if self._t_steps is None:
            self._t_steps = time.monotonic()
            if cfg.time_limit_s is not None:
                self._deadline = self._t_steps + cfg.time_limit_s
        t_call = time.monotonic()
        # In rounds of seconds, a copy also ends its round once it has trained that long:
        # its quota comes from the last round's rate (the first from a probe of a few
        # iterations), and a copy whose quota overshoots would keep the others waiting at the
        # barrier (idle GPUs); the commit counts what it did.
        kind, length = cfg.round_length
        cut = length if kind == "seconds" else math.inf
        try:
            while self._state.done < target and self.stopped is None:
                state = self._state
                quotas = self._plan(state, target)
                quota = quotas[cfg.index]
                self.round = state.round + 1
                self._phase = "training"
                iters, stop = 0, None
                self._beat("training", iters=0)
                t0 = time.monotonic()
                while True:
                    stop = self._stop_reason()
                    if stop is not None or iters >= quota:
                        break
                    tick = time.monotonic()
                    if iters and tick - t0 >= cut:
                        break
                    if tick - self._last_beat >= cfg.heartbeat_s:
                        self._beat("training", iters=iters)
                    yield state.done + iters
                    iters += 1
                    self._executed += 1
                seconds = time.monotonic() - t0
                self._state = self._end_round(state, quotas, iters, seconds, stop)
                if self._state.stop is not None:
                    self.stopped = self._state.stop
        finally:
            self._seconds += time.monotonic() - t_call
        if self.stopped is not None and self.stopped.startswith("signal"):
            msg = (f"hadar: {self._label}: stopped ({self.stopped}) after round "
                   f"{self._state.round}: {self._state.done}/{cfg.work} iterations saved; "
                   f"exit {EXIT_PREEMPTED} so that the job can be requeued")
            print(msg, file=sys.stderr, flush=True)
            exc = Preempted(msg)
            self._leave(exc)
            raise exc

    def finish(self) -> RunSummary:
        """Copy 0 writes the consolidated model's state dict to the output path (also when a
        time limit stopped the job early); every copy says goodbye to the tracker."""
        written = self._write_output(only_if_missing=False)
        if self._state.complete and self.config.coordinator:
            self._cleanup_reports(upto=None)
        self._leave(None)
        return RunSummary(
            work=self.config.work, done=self._state.done, rounds=self._state.round,
            complete=self._state.complete, stopped=self.stopped, executed=self._executed,
            seconds=self._seconds, output=written)

    def close(self) -> None:
        self._leave(None)

    def __enter__(self) -> JobRuntime:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._leave(exc)

    # -------------------------------------------------------------------- joining
    def _join(self) -> CommittedState:
        cfg = self.config
        state = CommittedState.load(self.paths.state)
        if state is not None and state.work != cfg.work:
            raise InputError(
                f"the tracker dir {cfg.tracker_dir} belongs to a job of {state.work} iterations, "
                f"this run asks for {cfg.work}", source="runtime config", field="work",
                fix="use the same work for every run of a job, or another tracker dir")
        if state is None and cfg.copies > 1:
            if cfg.coordinator:
                # All copies must start from the same parameters: commit round 0, once every
                # copy has said hello (so that they start training together).
                def absent() -> list[int]:
                    return [j for j in range(1, cfg.copies)
                            if not self.paths.heartbeat(cfg.run_id, j).exists()]

                self._phase = "waiting for the copies to start"
                self._wait(lambda: None if absent() else True, absent,
                           "every copy to start")
                state = self._commit(CommittedState(work=cfg.work, job=cfg.job_key),
                                     self._own_states(), [], None)
            else:
                self._phase = "waiting for round 0"
                state = self._wait(lambda: CommittedState.load(self.paths.state),
                                   lambda: [0], "copy 0's initial model (round 0)")
        if state is None:
            state = CommittedState(work=cfg.work, job=cfg.job_key, copies=cfg.copies)
            where = "starting"
        else:
            state = self._load_checkpoint(state)
            where = "resuming" if state.done > 0 else "starting"
            if cfg.coordinator:
                self._repair_history(state)
        restart = f", restart {cfg.restart_count}" if cfg.restart_count else ""
        gpu = f" on {cfg.gpu_type}" if cfg.gpu_type else ""
        self._say(f"{where} at round {state.round}, {state.done}/{cfg.work} iterations done "
                  f"(device {self.device}{gpu}, run {cfg.run_id or '-'}{restart}, tracker "
                  f"{cfg.tracker_dir})")
        return state

    def _repair_history(self, state: CommittedState) -> None:
        """A run killed between its commit (``state.json``) and its history line leaves the
        history a round short, or ends it with half a line: drop a broken line and write the
        committed round's line from the state (``recovered``: its per-copy seconds are not
        known)."""
        try:
            text = self.paths.history.read_text(encoding="utf-8")
        except FileNotFoundError:
            text = ""
        kept: list[str] = []
        last_round, last_done = 0, 0
        for line in text.splitlines():
            try:
                rec = json.loads(line)
                last_round, last_done = int(rec["round"]), int(rec["done"])
            except (ValueError, KeyError, TypeError):
                continue  # half a line: the run was killed while writing it
            kept.append(line)
        missing = state.round > last_round and state.done >= last_done
        if not missing and len(kept) == len(text.splitlines()) and (
                not text or text.endswith("\n")):
            return
        if missing:
            kept.append(json.dumps({
                "round": state.round, "done": state.done, "iters": [state.done - last_done],
                "seconds": [None], "stop": state.stop, "run": state.run,
                "time": state.updated_at, "recovered": True}))
        atomic_write_bytes(self.paths.history,
                           "".join(line + "\n" for line in kept).encode(), durable=True)

    def _load_checkpoint(self, state: CommittedState) -> CommittedState:
        """Load the checkpoint ``state`` names into the model and optimizer; the state that was
        loaded (a newer one when copy 0 committed again and removed that file meanwhile)."""
        for _ in range(100):
            if state.checkpoint is None:
                return state
            try:
                obj = _load_torch(self.paths.root / state.checkpoint, self.device)
                break
            except FileNotFoundError:
                newer = CommittedState.load(self.paths.state)
                if newer is None or newer.round <= state.round:
                    raise
                state = newer
        else:
            raise RuntimeError(f"{self.paths.state}: the checkpoints keep disappearing")
        self.model.load_state_dict(obj["model"])
        if self.optimizer is not None and obj.get("optim") is not None:
            self.optimizer.load_state_dict(obj["optim"])
        return state

    def _own_states(self) -> tuple[Any, Any]:
        optim = None if self.optimizer is None else self.optimizer.state_dict()
        return self.model.state_dict(), optim

    # -------------------------------------------------------------------- rounds
    def _plan(self, state: CommittedState, target: int) -> tuple[int, ...]:
        cfg = self.config
        rates = state.rates if state.copies == cfg.copies else ()
        return plan_round(min(target, state.work) - state.done, cfg.copies, rates,
                          round_iters=cfg.round_iters, round_seconds=cfg.round_seconds,
                          probe_iters=cfg.probe_iters)

    def _gpu_mem_mib(self) -> float | None:
        """The most memory this process held on its GPU so far, MiB: torch's peak
        reservation plus a CUDA context (:data:`hadar_slurm.rates.memory.CONTEXT_MIB`); None
        off CUDA."""
        if self.device.type != "cuda":
            return None
        try:
            peak = float(torch.cuda.max_memory_reserved(self.device))
        except RuntimeError:
            return None
        return round(peak / MIB + CONTEXT_MIB, 1) if peak > 0 else None

    def _stop_reason(self) -> str | None:
        if self._signals:
            return f"signal {self._signals[0]}"
        if self._deadline is not None and time.monotonic() >= self._deadline:
            return "time limit"
        return None

    def _end_round(self, state: CommittedState, quotas: tuple[int, ...], iters: int,
                   seconds: float, stop: str | None) -> CommittedState:
        cfg = self.config
        me = _Report(cfg.index, iters, seconds, stop, cfg.gpu_type, "", self._gpu_mem_mib())
        if cfg.copies == 1:
            if iters == 0:  # stopped before its first iteration: no new model, but the
                return self._commit(state, None, [], stop)  # commit files carry the stop
            return self._commit(state, self._own_states(), [me], stop)
        if cfg.coordinator:
            return self._coordinate(state, quotas, me)
        self._send_report(state, quotas, me)
        self._phase = "waiting for the commit"
        r = state.round + 1

        def committed() -> CommittedState | None:
            new = CommittedState.load(self.paths.state)
            return new if new is not None and new.round >= r else None

        def needed() -> list[int]:
            return [0] + [j for j in range(1, cfg.copies) if j != cfg.index
                          and not self.paths.report_meta(r, j).exists()]

        new = self._wait(committed, needed, f"round {r} to be committed")
        return self._load_checkpoint(new)

    def _report_meta(self, state: CommittedState, quotas: tuple[int, ...],
                     me: _Report) -> dict[str, Any]:
        return {
            "format": FORMAT, "round": state.round + 1, "base_round": state.round,
            "base_done": state.done, "copies": self.config.copies, "copy": me.copy,
            "quota": quotas[me.copy], "iters": me.iters, "seconds": me.seconds,
            "stop": me.stop, "run": self.config.run_id, "gpu_type": me.gpu_type,
            "gpu_mem_mib": me.gpu_mem_mib,
            "host": self._host, "pid": os.getpid(), "nonce": me.nonce, "time": now(),
        }

    def _send_report(self, state: CommittedState, quotas: tuple[int, ...],
                     me: _Report) -> None:
        """Parameters first, then the metadata that names them (the report counts once its
        metadata is there; the nonce ties the two together)."""
        r = state.round + 1
        me.nonce = secrets.token_hex(8)
        model, optim = self._own_states()
        _save_torch(self.paths.report_data(r, me.copy),
                    {"nonce": me.nonce, "model": model, "optim": optim}, durable=False)
        atomic_write_json(self.paths.report_meta(r, me.copy), self._report_meta(state, quotas, me))

    def _valid_meta(self, state: CommittedState, quotas: tuple[int, ...],
                    copy: int) -> tuple[dict[str, Any] | None, str]:
        """Copy ``copy``'s report for the next round if it fits this run and plan (a report
        left by an earlier run of the job does not), else None and why."""
        try:
            meta = read_json(self.paths.report_meta(state.round + 1, copy))
        except (OSError, ValueError) as exc:
            return None, f"unreadable report ({exc})"
        if meta is None:
            return None, "no report"
        want = {"format": FORMAT, "base_round": state.round, "base_done": state.done,
                "copies": self.config.copies, "copy": copy, "quota": quotas[copy]}
        for key, value in want.items():
            if meta.get(key) != value:
                return None, f"its report has {key}={meta.get(key)!r}, this run expects {value!r}"
        run = meta.get("run")
        if run != self.config.run_id and None not in (run, self.config.run_id):
            return None, f"its report is from run {run}, this is run {self.config.run_id}"
        iters = meta.get("iters")
        if not isinstance(iters, int) or not 0 <= iters <= quotas[copy]:
            return None, f"its report has iters={iters!r} (quota {quotas[copy]})"
        return meta, ""

    def _coordinate(self, state: CommittedState, quotas: tuple[int, ...],
                    me: _Report) -> CommittedState:
        """Copy 0: wait for every copy's report, average, commit."""
        cfg = self.config
        r = state.round + 1
        self._phase = "waiting for reports"
        metas: dict[int, dict[str, Any]] = {}
        why: dict[int, str] = {}

        def missing() -> list[int]:
            for j in range(1, cfg.copies):
                if j not in metas:
                    meta, reason = self._valid_meta(state, quotas, j)
                    if meta is None:
                        why[j] = reason
                    else:
                        metas[j] = meta
            return [j for j in range(1, cfg.copies) if j not in metas]

        def all_in() -> bool | None:
            return True if not missing() else None

        self._wait(all_in, missing, f"the copies' reports for round {r}", why=why)

        reports = [me]
        averager = _Averager()
        optim_avg = _Averager() if self.optimizer is not None else None
        model_sd, optim_sd = self._own_states()
        if me.iters > 0:
            averager.add(model_sd, me.iters)
            if optim_avg is not None:
                optim_avg.add(optim_sd, me.iters)
        for j in range(1, cfg.copies):
            while True:
                meta = metas[j]
                data = None
                if meta["iters"] > 0:
                    data = _load_torch(self.paths.report_data(r, j), "cpu")
                    if data.get("nonce") != meta["nonce"]:  # being rewritten: read both again
                        del metas[j]
                        self._wait(all_in, missing, f"copy {j}'s report for round {r}", why=why)
                        continue
                break
            mem = meta.get("gpu_mem_mib")
            reports.append(_Report(j, meta["iters"], float(meta["seconds"]), meta.get("stop"),
                                   meta.get("gpu_type"), meta["nonce"],
                                   float(mem) if isinstance(mem, int | float) else None))
            if data is not None:
                averager.add(data["model"], meta["iters"])
                if optim_avg is not None and data.get("optim") is not None:
                    optim_avg.add(data["optim"], meta["iters"])
            del data
            self._beat("averaging")
        stops = [self._stop_reason()] + [rep.stop for rep in reports]
        stop = next((s for s in stops if s is not None), None)
        if averager.count == 0:  # nobody trained (all stopped at once): keep the last model
            return self._commit(state, None, reports, stop)
        model_avg = averager.result()
        optim_new = optim_avg.result() if optim_avg is not None and optim_avg.count else None
        self.model.load_state_dict(model_avg)
        if self.optimizer is not None and optim_new is not None:
            self.optimizer.load_state_dict(optim_new)
        return self._commit(state, (model_avg, optim_new), reports, stop)

    def _commit(self, prev: CommittedState, states: tuple[Any, Any] | None,
                reports: Sequence[_Report], stop: str | None) -> CommittedState:
        """Write the consolidated checkpoint, then state.json naming it (the commit point),
        then progress.json and a line of history; print one line."""
        cfg = self.config
        r = prev.round + 1 if reports else prev.round
        iters = [rep.iters for rep in sorted(reports, key=lambda rep: rep.copy)]
        done = prev.done + sum(iters)
        checkpoint = prev.checkpoint
        if states is not None:
            model, optim = states
            path = self.paths.checkpoint(r)
            _save_torch(path, {"format": FORMAT, "round": r, "done": done, "model": model,
                               "optim": optim}, durable=True)
            checkpoint = path.name
        old_rates = prev.rates if prev.copies == cfg.copies else ()
        rates: list[float | None] = []
        for k in range(cfg.copies):
            rep = next((x for x in reports if x.copy == k), None)
            if rep is not None and rep.iters > 0 and rep.seconds > 0:
                rates.append(rep.iters / rep.seconds)
            else:
                rates.append(old_rates[k] if k < len(old_rates) else None)
        state = CommittedState(
            work=cfg.work, round=r, done=done, checkpoint=checkpoint, copies=cfg.copies,
            rates=tuple(rates), stop=stop, run=cfg.run_id, job=cfg.job_key, updated_at=now())
        atomic_write_json(self.paths.state, state.to_json(), durable=True)

        per_copy = []
        for k in range(cfg.copies):
            rep = next((x for x in reports if x.copy == k), None)
            per_copy.append({
                "copy": k, "gpu_type": None if rep is None else rep.gpu_type,
                "iters": None if rep is None else rep.iters,
                "seconds": None if rep is None else round(rep.seconds, 6),
                "iters_per_s": None if rates[k] is None else round(rates[k] or 0.0, 6),
                "gpu_mem_mib": None if rep is None else rep.gpu_mem_mib,
            })
        total_rate = sum(r_ for r_ in rates if r_ is not None)
        if reports:
            self._run_rounds += 1
        progress = {
            "format": FORMAT, "job": cfg.job_key, "work": cfg.work, "done": done,
            "remaining": cfg.work - done, "rounds": r, "copies": cfg.copies,
            "copy_rates": per_copy, "iters_per_s": round(total_rate, 6),
            "complete": done >= cfg.work, "stop": stop, "run": cfg.run_id,
            "run_rounds": self._run_rounds,
            "checkpoint": checkpoint, "updated_at": state.updated_at,
        }
        atomic_write_json(self.paths.progress, progress)
        line = {"round": r, "done": done, "iters": iters,
                "seconds": [round(x.seconds, 6) for x in sorted(reports, key=lambda x: x.copy)],
                "stop": stop, "run": cfg.run_id, "time": state.updated_at}
        with open(self.paths.history, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")

        shown = ", ".join("?" if x is None else f"{x:.1f}" for x in rates)
        stopping = f"; stopping ({stop})" if stop else ""
        if reports:
            self._say(f"round {r}: {done}/{cfg.work} iterations ({100.0 * done / cfg.work:.1f}%),"
                      f" {cfg.copies} cop{'y' if cfg.copies == 1 else 'ies'} at {shown} it/s "
                      f"(total {total_rate:.1f} it/s){stopping}")
        elif states is None:
            self._say(f"round {r}: nothing new since the last commit{stopping}")
        else:
            self._say(f"round {r}: initial model committed for the {cfg.copies} copies")
        self._cleanup_reports(upto=r)
        keep = {checkpoint, prev.checkpoint}
        for _, path in self.paths.checkpoints():
            if path.name not in keep:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return state

    def _cleanup_reports(self, upto: int | None) -> None:
        root = self.paths.reports
        if not root.is_dir():
            return
        for folder in root.iterdir():
            digits = folder.name.removeprefix("round-")
            if digits.isdigit() and (upto is None or int(digits) <= upto):
                for item in folder.iterdir():
                    with contextlib.suppress(FileNotFoundError):
                        item.unlink()
                with contextlib.suppress(OSError):
                    folder.rmdir()

    # -------------------------------------------------------------------- barrier
    def _wait(self, ready: Callable[[], T | None], needed: Callable[[], list[int]],
              what: str, why: Mapping[int, str] | None = None) -> T:
        """Poll ``ready()`` until it returns something.  Meanwhile watch the heartbeats of the
        copies ``needed()`` names: one that has not changed for ``barrier_timeout_s`` seconds
        (or that says it exited, in this run; or that has sent no heartbeat in this run at all
        for the longer of that and ``_STARTUP_GRACE_S``) ends the wait with :class:`CopyLost`."""
        cfg = self.config
        start = time.monotonic()
        seen: dict[int, tuple[object, float]] = {}
        poll = 0.002
        while True:
            got = ready()
            if got is not None:
                return got
            if len(self._signals) >= 2:
                msg = (f"hadar: {self._label}: second signal ({', '.join(self._signals)}) while "
                       f"waiting for {what}: stopping now; work since round "
                       f"{self._state_round()} is lost")
                print(msg, file=sys.stderr, flush=True)
                raise Preempted(msg)
            t = time.monotonic()
            if t - self._last_beat >= cfg.heartbeat_s:
                self._beat(self._phase)
            for j in needed():
                if j == cfg.index:
                    continue
                beat = self._read_beat(j)
                key = None if beat is None else (beat.get("pid"), beat.get("host"),
                                                 beat.get("beat"), beat.get("state"))
                if j not in seen:
                    seen[j] = (key, start)  # silence counts from the start of this wait
                elif seen[j][0] != key:
                    seen[j] = (key, t)  # it changed: alive now
                exited = (beat is not None and beat.get("state") == "exited"
                          and cfg.run_id is not None and beat.get("run") == cfg.run_id)
                # A copy that has not said hello in this run at all may still be starting
                # (imports, CUDA init, a slow node): it gets at least _STARTUP_GRACE_S.
                limit = cfg.barrier_timeout_s if beat is not None else max(
                    cfg.barrier_timeout_s, _STARTUP_GRACE_S)
                silent = t - seen[j][1] >= limit
                if exited or silent:
                    got = ready()
                    if got is not None:
                        return got
                    raise self._lost(j, what, beat, exited, t - start, why)
            time.sleep(poll)
            poll = min(poll * 1.5, _MAX_POLL_S)

    def _state_round(self) -> int:
        state = getattr(self, "_state", None)
        return 0 if state is None else state.round

    def _lost(self, j: int, what: str, beat: dict[str, Any] | None, exited: bool,
              waited: float, why: Mapping[int, str] | None) -> CopyLost:
        cfg = self.config
        if beat is None:
            cause = (f"copy {j} has sent no heartbeat in this run for "
                     f"{max(cfg.barrier_timeout_s, _STARTUP_GRACE_S):g} s")
        else:
            where = f"copy {j} (host {beat.get('host')}, pid {beat.get('pid')})"
            cause = (f"{where} exited in round {beat.get('round')}: {beat.get('reason')}"
                     if exited else
                     f"{where}, last seen {beat.get('state')} in round {beat.get('round')}, "
                     f"shows no sign of life for {cfg.barrier_timeout_s:g} s")
        detail = f" ({why[j]})" if why and j in why and why[j] != "no report" else ""
        reason = f"gave up waiting for {what} after {waited:.1f} s: {cause}{detail}"
        msg = (f"hadar: {self._label}: {reason}.  Exit {EXIT_COPY_LOST}: requeue the job; "
               f"it resumes from round {self._state_round()} (the work since then is lost)")
        print(msg, file=sys.stderr, flush=True)
        return CopyLost(msg, reason=reason)

    # -------------------------------------------------------------------- heartbeats, signals
    def _read_beat(self, copy: int) -> dict[str, Any] | None:
        try:
            return read_json(self.paths.heartbeat(self.config.run_id, copy))
        except (OSError, ValueError):
            return None

    def _beat(self, phase: str, *, iters: int | None = None, force: bool = False,
              reason: str | None = None) -> None:
        self._beats += 1
        self._last_beat = time.monotonic()
        cfg = self.config
        body = {
            "copy": cfg.index, "copies": cfg.copies, "run": cfg.run_id, "host": self._host,
            "pid": os.getpid(), "gpu_type": cfg.gpu_type, "beat": self._beats, "state": phase,
            "round": self.round, "iters_in_round": iters, "executed": self._executed,
            "started_at": self._started, "time": now(), "reason": reason,
        }
        try:
            atomic_write_json(self.paths.heartbeat(cfg.run_id, cfg.index), body)
        except OSError:
            if force:
                raise

    def _install_signals(self) -> None:
        for name in self.config.preempt_signals:
            sig = signal_number(name)
            try:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: leave the signals alone
                return

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals.append(signal.Signals(signum).name.removeprefix("SIG"))

    def _leave(self, exc: BaseException | None) -> None:
        """Say goodbye (a last heartbeat: exited, and why) and restore the signal handlers."""
        if self._closed:
            return
        self._closed = True
        if exc is None:
            reason = self.stopped or ("finished" if self._state_complete() else "closed")
        elif isinstance(exc, JobStop):
            reason = exc.reason
        else:
            reason = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(OSError):
            self._beat("exited", reason=reason)
        for sig, handler in self._old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
        self._old_handlers.clear()

    def _state_complete(self) -> bool:
        state = getattr(self, "_state", None)
        return bool(state is not None and state.complete)

    # -------------------------------------------------------------------- output
    def _write_output(self, *, only_if_missing: bool) -> Path | None:
        if self.output is None or not self.config.coordinator:
            return None
        if only_if_missing and self.output.exists():
            return self.output
        _save_torch(self.output, self.model.state_dict(), durable=True)
        return self.output

    def _say(self, text: str) -> None:
        print(f"hadar: {self._label}: {text}", file=self._log, flush=True)

