"""``hadar-slurm report``: the last day (or any window) of a sidecar, from its JSON log.

The sidecar's ``epoch`` log lines carry what is plotted (:mod:`hadar_slurm.sidecar.metrics`):
``gpus_busy``/``gpus_total`` per GPU type, ``queue`` (hadar jobs waiting after the decision)
and ``finished`` (jobs seen finished, with their JCT).  The log is read with its rotated
siblings (``FILE.1``, ``FILE.2.gz``, ``FILE-20261122[.gz]``: logrotate's names), in any order;
epochs are placed in time by ``epoch_start`` (older lines: their ``ts``).

The PNG has three panels: GPUs busy per type over time (each type's total dashed), the queue
length over time, and the CDF of the JCTs of the jobs that completed in the window.  The HTML
embeds that PNG (base64), a summary table and, when tuning studies ran in the window (issue
#17: the ``study_seen``, ``trial_report``, ``trial_verdict`` and ``study_done`` events), one
row per study, rung by rung, so it is one self-contained file.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from hadar_slurm.errors import InputError
from hadar_slurm.logs import read_events

#: Names logrotate gives a rotated ``FILE``: ``FILE.1``, ``FILE.2.gz``, ``FILE-20261122``.
_ROTATED = r"(?:\.\d+|-\d{8,10})(?:\.gz)?"
#: Log levels counted as problems in the summary.
_PROBLEM_LEVELS = ("warning", "error", "critical")
#: A gap between epochs longer than this many typical intervals breaks the lines (the sidecar
#: did not run then).
_GAP_FACTOR = 5.0


@dataclass(frozen=True)
class EpochPoint:
    """One epoch of the log."""

    t: float  # Unix time it started
    epoch: int
    queue: int | None  # None: a line written before the field existed
    gpus_busy: Mapping[str, int]
    gpus_total: Mapping[str, int]
    duration_s: float | None
    decide_s: float | None
    placements: int


@dataclass(frozen=True)
class FinishedJob:
    job: int
    state: str
    submit: float
    jct_s: float
    jct_err_s: float

    @property
    def end(self) -> float:
        return self.submit + self.jct_s


@dataclass
class StudyLog:
    """What the log says of one tuning study in the window: its reports and verdicts by rung,
    its best report so far and, once it ended, the best trial and how long it took."""

    array: int
    name: str = ""
    rule: str = ""
    rungs: int = 0
    reports: dict[int, int] = field(default_factory=dict)  # rung -> reports
    verdicts: dict[int, dict[str, int]] = field(default_factory=dict)  # rung -> verdict -> n
    best: dict[int, float] = field(default_factory=dict)  # rung -> best value (by mode)
    mode: str = "max"
    ended_s: float | None = None  # the study's wall time, once it ended
    best_task: int | None = None
    best_value: float | None = None

    def row(self) -> tuple[str, str, str, str]:
        """``(study, rule, by rung, result)`` for the report's table."""
        rungs = []
        for rung in sorted(set(self.reports) | set(self.verdicts)):
            v = self.verdicts.get(rung, {})
            text = f"rung {rung}: {self.reports.get(rung, 0)} reported"
            text += "".join(f", {n} {k}" for k, n in sorted(v.items()))
            if rung in self.best:
                text += f", best {_num(self.best[rung])}"
            rungs.append(text)
        if self.ended_s is not None:
            result = (f"ended after {_dur(self.ended_s)}; best trial {self.best_task}"
                      + (f" ({_num(self.best_value)})" if self.best_value is not None else ""))
        else:
            result = "running"
        return (f"{self.name} (array {self.array})", f"{self.rule}, {self.rungs} rungs",
                "; ".join(rungs), result)


@dataclass(frozen=True)
class DailyReport:
    """The epochs and finished jobs of a log in ``[start, end]``."""

    start: float
    end: float
    files: tuple[str, ...]
    epochs: tuple[EpochPoint, ...]
    finished: tuple[FinishedJob, ...]
    policies: tuple[str, ...] = ()
    starts: int = 0  # sidecar starts in the window
    problems: Mapping[str, int] = field(default_factory=dict)  # warning events by name
    studies: tuple[StudyLog, ...] = ()

    @property
    def gpu_types(self) -> list[str]:
        types: list[str] = []
        for p in self.epochs:
            for t in [*p.gpus_total, *p.gpus_busy]:
                if t not in types:
                    types.append(t)
        return types

    @property
    def completed(self) -> list[FinishedJob]:
        return [f for f in self.finished if f.state == "COMPLETED"]

    def summary(self) -> list[tuple[str, str]]:
        """``(what, value)`` rows of the summary table."""
        rows = [
            ("window (UTC)", f"{_utc(self.start)} to {_utc(self.end)}"),
            ("log files", ", ".join(self.files)),
            ("policy", ", ".join(self.policies) or "(no start event in the window)"),
            ("sidecar starts", str(self.starts)),
            ("epochs", f"{len(self.epochs)} (first {_utc(self.epochs[0].t)}, last "
                       f"{_utc(self.epochs[-1].t)})" if self.epochs else "0"),
        ]
        durations = [p.duration_s for p in self.epochs if p.duration_s is not None]
        if durations:
            rows.append(("epoch time (s)", f"median {_num(float(np.median(durations)))}, max "
                                           f"{_num(max(durations))}"))
        decides = [p.decide_s for p in self.epochs if p.decide_s is not None]
        if decides:
            rows.append(("decision time (s)", f"median {_num(float(np.median(decides)))}, max "
                                              f"{_num(max(decides))}"))
        rows.append(("placements", str(sum(p.placements for p in self.epochs))))
        queues = [p.queue for p in self.epochs if p.queue is not None]
        if queues:
            rows.append(("queue length", f"mean {_num(float(np.mean(queues)))}, max "
                                         f"{max(queues)}"))
        for t in self.gpu_types:
            busy = [p.gpus_busy.get(t, 0) for p in self.epochs if t in p.gpus_total]
            total = max((p.gpus_total.get(t, 0) for p in self.epochs), default=0)
            if busy and total:
                rows.append((f"GPUs busy, {t}", f"mean {_num(float(np.mean(busy)))} of "
                                                f"{total} ({100 * np.mean(busy) / total:.0f}%)"))
        states: dict[str, int] = {}
        for f in self.finished:
            states[f.state] = states.get(f.state, 0) + 1
        rows.append(("jobs finished", ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
                     or "0"))
        jct = np.array([f.jct_s for f in self.completed])
        if jct.shape[0]:
            rows.append(("JCT of completed jobs", f"mean {_dur(float(np.mean(jct)))}, median "
                         f"{_dur(float(np.median(jct)))}, p95 "
                         f"{_dur(float(np.percentile(jct, 95)))}"))
        if self.studies:
            ended = sum(1 for st in self.studies if st.ended_s is not None)
            rows.append(("tuning studies", f"{len(self.studies)} ({ended} ended)"))
        rows.append(("warnings/errors", ", ".join(
            f"{n} {k}" for k, n in sorted(self.problems.items())) or "none"))
        return rows


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _num(x: float) -> str:
    return f"{x:.3g}"


def _dur(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


# -- reading -----------------------------------------------------------------------------------


def log_files(path: str | Path) -> list[Path]:
    """``path`` and its rotated siblings that exist, newest name first."""
    p = Path(path)
    pattern = re.compile(re.escape(p.name) + _ROTATED + "$")
    rotated = sorted((q for q in p.parent.glob(p.name + "*") if pattern.match(q.name)),
                     key=lambda q: q.name)
    return ([p] if p.is_file() else []) + [q for q in rotated if q.is_file()]


def _time(event: Mapping[str, object]) -> float | None:
    """When an event happened: ``epoch_start`` (epochs), else its ``ts``."""
    t = event.get("epoch_start")
    if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t):
        return float(t)
    ts = event.get("ts")
    if not isinstance(ts, str):
        return None
    try:
        return datetime.strptime(ts.rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f").replace(
            tzinfo=UTC).timestamp()
    except ValueError:
        try:
            return datetime.strptime(ts.rstrip("Z"), "%Y-%m-%dT%H:%M:%S").replace(
                tzinfo=UTC).timestamp()
        except ValueError:
            return None


def _int(value: object, default: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return int(value) if math.isfinite(value) else default


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _counts(value: object) -> dict[str, int]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): _int(v) for k, v in value.items()}


def build_report(events: Iterable[Mapping[str, object]], start: float, end: float,
                 files: Sequence[str] = ()) -> DailyReport:
    """The report of ``events`` (a sidecar's log lines) between ``start`` and ``end``."""
    epochs: list[EpochPoint] = []
    finished: dict[int, FinishedJob] = {}
    policies: list[str] = []
    starts = 0
    problems: dict[str, int] = {}
    studies: dict[int, StudyLog] = {}
    for e in events:
        t = _time(e)
        if t is None or not start <= t <= end:
            continue
        kind = e.get("event")
        if kind in _STUDY_EVENTS:
            _study_event(studies, e)
        if kind == "epoch":
            epochs.append(EpochPoint(
                t=t, epoch=_int(e.get("epoch")),
                queue=_int(e.get("queue")) if "queue" in e else None,
                gpus_busy=_counts(e.get("gpus_busy")), gpus_total=_counts(e.get("gpus_total")),
                duration_s=_float(e.get("duration_s")), decide_s=_float(e.get("decide_s")),
                placements=_int(e.get("placements"))))
            done = e.get("finished")
            for f in done if isinstance(done, list) else []:
                if not isinstance(f, Mapping):
                    continue
                job, jct = _int(f.get("job"), -1), _float(f.get("jct_s"))
                if job < 0 or jct is None or job in finished:
                    continue
                finished[job] = FinishedJob(job, str(f.get("state", "")),
                                            _float(f.get("submit")) or 0.0, jct,
                                            _float(f.get("jct_err_s")) or 0.0)
        elif kind == "start":
            starts += 1
            policy = str(e.get("policy", ""))
            if policy and policy not in policies:
                policies.append(policy)
        if str(e.get("level", "")) in _PROBLEM_LEVELS:
            name = str(kind)
            problems[name] = problems.get(name, 0) + 1
    epochs.sort(key=lambda p: p.t)
    return DailyReport(start, end, tuple(files), tuple(epochs),
                       tuple(sorted(finished.values(), key=lambda f: (f.end, f.job))),
                       tuple(policies), starts, problems,
                       tuple(st for _, st in sorted(studies.items())))


_STUDY_EVENTS = ("study_seen", "trial_report", "trial_verdict", "study_done")


def _study_event(studies: dict[int, StudyLog], e: Mapping[str, object]) -> None:
    """Fold one study event (:mod:`hadar_slurm.sidecar.studies`) into ``studies``."""
    array = _int(e.get("array"), -1)
    if array < 0:
        return
    st = studies.setdefault(array, StudyLog(array, name=str(e.get("study", ""))))
    kind = e.get("event")
    rung = _int(e.get("rung"), -1)
    if kind == "study_seen":
        st.rule, st.rungs = str(e.get("rule", "")), _int(e.get("rungs"))
        st.mode = "min" if e.get("mode") == "min" else "max"
    elif kind == "trial_report" and rung >= 0:
        st.reports[rung] = st.reports.get(rung, 0) + 1
        value = _signed(e.get("value"))
        if value is not None:
            best = st.best.get(rung)
            better = best is None or (value > best if st.mode == "max" else value < best)
            st.best[rung] = value if better else best  # type: ignore[assignment]
    elif kind == "trial_verdict" and rung >= 0 and e.get("verdict") != "wait":
        counts = st.verdicts.setdefault(rung, {})
        verdict = {"go": "went on", "stop": "stopped"}.get(str(e.get("verdict")),
                                                           str(e.get("verdict")))
        counts[verdict] = counts.get(verdict, 0) + 1
    elif kind == "study_done":
        st.ended_s = _float(e.get("seconds"))
        task = e.get("best_task")
        st.best_task = task if isinstance(task, int) and not isinstance(task, bool) else None
        st.best_value = _signed(e.get("best"))


def _signed(value: object) -> float | None:
    """A finite number (of either sign), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def load_report(log: str | Path, since_s: float, now: float) -> DailyReport:
    """The report of the log at ``log`` (and its rotated files) over ``[now - since_s, now]``.
    No log, or no epoch in the window, is an :class:`InputError`."""
    files = log_files(log)
    if not files:
        raise InputError("no such log file", source=str(log),
                         fix="give the sidecar's [sidecar] log_file (JSON lines)")
    events: list[dict[str, object]] = []
    for f in files:
        try:
            events += read_events(f)
        except (OSError, EOFError) as exc:
            raise InputError(f"cannot read the log: {exc}", source=str(f)) from None
    report = build_report(events, now - since_s, now, [str(f) for f in files])
    if not report.epochs:
        times = [t for e in events if e.get("event") == "epoch" and (t := _time(e)) is not None]
        last = f"its last epoch is at {_utc(max(times))} UTC" if times else "it has no epoch"
        raise InputError(
            f"no epoch in the window {_utc(now - since_s)} to {_utc(now)} UTC ({last})",
            source=str(log), field="--since",
            fix="give a longer --since, or the log of a sidecar that ran in that window "
            "with log_format = \"json\"")
    return report


# -- drawing -----------------------------------------------------------------------------------


def _steps(t: np.ndarray, ys: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Step curves: each epoch's value holds for one typical epoch interval (``dt``, 60 s with
    a single epoch) or until the next epoch; where the sidecar did not run (a gap of more than
    a few intervals) the curves break (NaN)."""
    if t.shape[0] == 0:
        return t, ys
    dt = float(np.median(np.diff(t))) if t.shape[0] > 1 else 60.0
    dt = dt if dt > 0 else 60.0
    xs: list[float] = []
    cols: list[list[float]] = [[] for _ in ys]
    for k in range(t.shape[0]):
        xs.append(float(t[k]))
        for c, y in zip(cols, ys, strict=True):
            c.append(float(y[k]))
        nxt = float(t[k + 1]) if k + 1 < t.shape[0] else math.inf
        if nxt - float(t[k]) > _GAP_FACTOR * dt:
            xs.append(float(t[k]) + dt)  # its value holds one interval, then nothing
            for c, y in zip(cols, ys, strict=True):
                c.append(float(y[k]) if math.isinf(nxt) else math.nan)
    return np.array(xs), [np.array(c) for c in cols]


def _dates(t: np.ndarray) -> list[datetime]:
    return [datetime.fromtimestamp(float(x), UTC) for x in t]


def figure(report: DailyReport) -> Figure:
    """The report's three panels."""
    fig, (ax_gpu, ax_q, ax_jct) = plt.subplots(3, 1, figsize=(9, 10))
    t = np.array([p.t for p in report.epochs], dtype=np.float64)
    types = report.gpu_types
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    busy = [np.array([p.gpus_busy.get(g, 0) if g in p.gpus_total or g in p.gpus_busy
                      else np.nan for p in report.epochs], dtype=np.float64) for g in types]
    total = [np.array([p.gpus_total.get(g, np.nan) for p in report.epochs], dtype=np.float64)
             for g in types]
    tg, series = _steps(t, busy + total)
    for k, g in enumerate(types):
        c = colors[k % len(colors)]
        cap = int(np.nanmax(total[k])) if np.isfinite(total[k]).any() else 0
        ax_gpu.step(_dates(tg), series[k], where="post", color=c, label=f"{g} ({cap} GPUs)")
        ax_gpu.step(_dates(tg), series[len(types) + k], where="post", color=c,
                    linestyle="--", linewidth=0.8)
    if not types:
        ax_gpu.text(0.5, 0.5, "no GPU counts in these epochs (a sidecar before the metrics)",
                    ha="center", va="center", transform=ax_gpu.transAxes)
    ax_gpu.set_ylabel("GPUs busy")
    ax_gpu.set_title("GPUs busy per type (dashed: the type's GPUs)", loc="left", fontsize=10)
    ax_gpu.set_ylim(bottom=0)
    if types:
        ax_gpu.legend(loc="upper left", fontsize=8)

    queue = np.array([np.nan if p.queue is None else p.queue for p in report.epochs],
                     dtype=np.float64)
    tq, (queue_g,) = _steps(t, [queue])
    ax_q.step(_dates(tq), queue_g, where="post", color="tab:red")
    ax_q.set_ylabel("jobs waiting")
    ax_q.set_title("Queue length (hadar jobs waiting after each epoch's decision)", loc="left",
                   fontsize=10)
    top = float(np.nanmax(queue)) if np.isfinite(queue).any() else 0.0
    ax_q.set_ylim(0, max(1.0, top) * 1.08)
    for ax in (ax_gpu, ax_q):
        ax.grid(True, alpha=0.3)
        locator = mdates.AutoDateLocator(tz=UTC)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))
        ax.set_xlabel("time (UTC)")

    jct = np.sort(np.array([f.jct_s for f in report.completed], dtype=np.float64))
    if jct.shape[0]:
        unit, scale = ("hours", 3600.0) if jct[-1] >= 2 * 3600 else (
            ("minutes", 60.0) if jct[-1] >= 120 else ("seconds", 1.0))
        frac = np.arange(1, jct.shape[0] + 1, dtype=np.float64) / jct.shape[0]
        ax_jct.step(np.concatenate([[0.0], jct / scale]), np.concatenate([[0.0], frac]),
                    where="post", color="tab:green")
        ax_jct.set_xlabel(f"job completion time ({unit})")
        ax_jct.set_xlim(left=0)
        ax_jct.set_title(f"JCT CDF of the {jct.shape[0]} jobs completed (median "
                         f"{_dur(float(np.median(jct)))})", loc="left", fontsize=10)
    else:
        ax_jct.text(0.5, 0.5, "no job completed in this window", ha="center", va="center",
                    transform=ax_jct.transAxes)
        ax_jct.set_title("JCT CDF", loc="left", fontsize=10)
    ax_jct.set_ylabel("fraction of jobs")
    ax_jct.set_ylim(0, 1.02)
    ax_jct.grid(True, alpha=0.3)
    fig.suptitle(f"hadar-slurm sidecar, {_utc(report.start)} to {_utc(report.end)} UTC",
                 fontsize=11)
    fig.tight_layout()
    return fig


def png_bytes(report: DailyReport) -> bytes:
    fig = figure(report)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=100)
    finally:
        plt.close(fig)
    return buf.getvalue()


def html_text(report: DailyReport, png: bytes | None = None) -> str:
    """One self-contained HTML page: the summary table and the plots (PNG, base64)."""
    png = png_bytes(report) if png is None else png
    rows = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                     for k, v in report.summary())
    studies = ""
    if report.studies:
        cells = "\n".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in st.row())
                          + "</tr>" for st in report.studies)
        studies = ("<h2>Tuning studies</h2>\n<table>\n<tr><th>study</th><th>rule</th>"
                   f"<th>by rung</th><th>result</th></tr>\n{cells}\n</table>\n")
    image = base64.b64encode(png).decode("ascii")
    title = f"hadar-slurm report, {_utc(report.start)} to {_utc(report.end)} UTC"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: left; }}
th {{ background: #f4f4f4; }}
</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<table>
{rows}
</table>
{studies}
<img alt="GPUs busy per type, queue length and JCT CDF" src="data:image/png;base64,{image}">
</body>
</html>
"""


def write_report(report: DailyReport, out: str | Path) -> Path:
    """Write the report as PNG or HTML, by ``out``'s suffix."""
    path = Path(out)
    suffix = path.suffix.lower()
    if suffix not in (".png", ".html", ".htm"):
        raise InputError(f"unknown report format {path.suffix or '(none)'!r}", source=str(out),
                         field="--out", fix="name a .png or .html file")
    png = png_bytes(report)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if suffix == ".png":
            path.write_bytes(png)
        else:
            path.write_text(html_text(report, png), encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write the report: {exc.strerror or exc}", source=str(out),
                         field="--out") from None
    return path


__all__ = [
    "DailyReport",
    "EpochPoint",
    "FinishedJob",
    "StudyLog",
    "build_report",
    "figure",
    "html_text",
    "load_report",
    "log_files",
    "png_bytes",
    "write_report",
]
