"""``hadar-slurm gpus``, ``gres-conf`` and ``profile``: a node's GPUs and measured throughputs.

::

    hadar-slurm gpus [--json]
    hadar-slurm gres-conf [--node NAME] [--full-type]
    hadar-slurm profile --model M [--batch-size B] [--gpus N] [--gpu-type T]
                        [--device cpu|cuda|cuda:N] [--warmup N] [--iters N | --seconds S]
                        [--threads N] [--db PATH | --config FILE] [--no-record] [--json]
    hadar-slurm profile --slurm --model M [--batch-size B] [--gpus N] [--gpu-type T[,T...]]
                        [--config sidecar.toml] [--workdir DIR] [--timeout S] ...

``gpus`` lists the GPUs NVML sees (index, name, memory, Slurm's autodetected type, the short
type, device file, UUID).  ``gres-conf`` prints the node's gres.conf lines and its slurm.conf
``Gres=``/``Feature=`` line (:func:`hadar_slurm.rates.nvml.gres_conf`).  Without NVML (no
nvidia-ml-py, no driver or library) or without any GPU, both print one line on stderr and exit
with status 3 (:data:`EXIT_NO_GPU`).

``profile`` benchmarks a model (:mod:`hadar_slurm.rates.profile`) and records its rate in the
throughput store (``--db``; else with ``--config`` the sidecar's own store; else
:func:`hadar_slurm.rates.store.default_store_path`: :func:`hadar_slurm.cli.store.store_path`) as
``measured`` under a GPU type: ``--gpu-type``, else on CUDA the short type of the GPU it ran on
(``a100``).  On the CPU nothing is recorded unless ``--gpu-type`` names the type to record under
(tests and dev clusters with fake GPUs do that); ``--no-record`` records nothing.  ``--slurm``
submits one job per GPU type of the cluster instead (:mod:`hadar_slurm.rates.profile_slurm`;
``--config``: the sidecar's config for ``[slurm] conf`` and ``partition``; else
``$SLURM_CONF``), waits, and records each type's rate here; exit status 1 when some type has no
result.  Bad options exit 2 (one line).

This module also runs on its own (``python -m hadar_slurm.cli.nvml``), which is what the
profiling jobs run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hadar_slurm.cli.store import DB_HELP, store_path
from hadar_slurm.durations import parse_seconds_value
from hadar_slurm.errors import InputError
from hadar_slurm.rates.nvml import NvmlUnavailable, gres_conf, list_gpus, short_type_name
from hadar_slurm.rates.profile import DEFAULT_WARMUP, profile_model, record_result
from hadar_slurm.rates.profile_models import BENCHMARKS, check_gpu_type
from hadar_slurm.rates.profile_slurm import ProfileRequest, profile_on_slurm
from hadar_slurm.rates.store import ThroughputStore

__all__ = ["EXIT_NO_GPU", "EXIT_SOME_FAILED", "main", "register"]

PROG = "hadar-slurm"
#: Exit status when NVML is not available or sees no GPU.
EXIT_NO_GPU = 3
#: Exit status of ``profile --slurm`` when some GPU type has no result.
EXIT_SOME_FAILED = 1
EXIT_INPUT = 2


def _no_gpu(exc: NvmlUnavailable) -> int:
    sys.stdout.flush()
    print(f"{PROG}: {exc}".replace("\n", " "), file=sys.stderr)
    return EXIT_NO_GPU


# ----------------------------------------------------------------------------------- gpus

def format_gpus(rows: Sequence[dict[str, Any]]) -> str:
    """The ``gpus`` table: one line per GPU under a header."""
    head = ("index", "name", "memory", "slurm type (AutoDetect=nvml)", "type", "file", "uuid")
    cells = [head] + [(str(r["index"]), r["name"], f"{r['memory_total_mib']} MiB",
                       r["slurm_type"] + (" (MIG)" if r["mig"] else ""), r["short_type"],
                       r["device_file"] or "-", r["uuid"]) for r in rows]
    widths = [max(len(row[k]) for row in cells) for k in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells) + "\n"


def cmd_gpus(args: argparse.Namespace) -> int:
    try:
        gpus = list_gpus()
    except NvmlUnavailable as exc:
        return _no_gpu(exc)
    rows = [g.to_json() for g in gpus]
    if args.json:
        print(json.dumps(rows))
    else:
        print(format_gpus(rows), end="")
    return 0


def cmd_gres_conf(args: argparse.Namespace) -> int:
    node = args.node or socket.gethostname().split(".", 1)[0]
    try:
        gpus = list_gpus()
    except NvmlUnavailable as exc:
        return _no_gpu(exc)
    print(gres_conf(gpus, node, full_type=args.full_type), end="")
    return 0


# ----------------------------------------------------------------------------------- profile

def _positive_int(what: str, low: int = 1) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"{what}: expected a whole number >= {low}, got "
                                             f"{text!r}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        return parse_seconds_value(text, positive=True)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive number of seconds, got {text!r}") from None


def _gpu_types(text: str) -> list[str]:
    return [check_gpu_type(t) for t in text.split(",")]


def _store(args: argparse.Namespace) -> ThroughputStore:
    return ThroughputStore(store_path(args.db, args.config))


def cmd_profile(args: argparse.Namespace) -> int:
    types = _gpu_types(args.gpu_type) if args.gpu_type else []
    if args.slurm:
        return _profile_slurm(args, types)
    if len(types) > 1:
        raise InputError("one GPU type to record under, not several", field="gpu-type",
                         fix="give several types only with --slurm")
    try:
        import torch  # noqa: F401  (profiling trains a model with it)
    except ImportError:
        raise InputError("profiling needs torch, which is not installed", field="model",
                         fix="pip install 'hadar-slurm[train]'") from None
    result = profile_model(
        args.model, args.batch_size, device=args.device, gpus=args.gpus,
        warmup_iters=args.warmup, timed_iters=args.iters, seconds=args.seconds,
        threads=args.threads)
    gpu_type = types[0] if types else None
    if gpu_type is None and result.device.startswith("cuda"):
        gpu_type = short_type_name(result.device_name)
    recorded: dict[str, Any] | None = None
    note = None
    if args.no_record:
        note = "not recorded (--no-record)"
    elif gpu_type is None:
        note = "not recorded: on the CPU, give --gpu-type to record under a GPU type's name"
    else:
        with _store(args) as store:
            entry = record_result(store, result, gpu_type)
            recorded = {"db": str(store.path), "job_type": entry.job_type,
                        "scale_factor": entry.scale_factor, "gpu_type": entry.gpu_type,
                        "rate": entry.rate, "source": entry.source}
        note = (f"recorded {result.job_type!r} x{result.scale_factor} on {gpu_type}: "
                f"{entry.rate:.4g} steps/s ({entry.source}) in {recorded['db']}")
        if not result.device.startswith("cuda"):
            note += f" (measured on {result.device}, recorded under {gpu_type} as asked)"
    if args.json:
        print(json.dumps({**result.to_json(), "recorded": recorded}), flush=True)
        print(f"{PROG}: {note}", file=sys.stderr)
    else:
        print(result.summary())
        print(note)
    return 0


def _profile_slurm(args: argparse.Namespace, types: list[str]) -> int:
    from hadar_slurm.sidecar.config import default_config, load_config
    from hadar_slurm.slurm import SlurmConfigError, SlurmError, SlurmRunner

    config = load_config(args.config) if args.config else default_config()
    try:
        runner = SlurmRunner(config.slurm_conf, timeout=config.command_timeout_s)
    except SlurmConfigError as exc:
        raise InputError(str(exc), source=config.source, field="[slurm] conf") from None
    request = ProfileRequest(
        model=args.model, batch_size=args.batch_size, gpus=args.gpus, warmup_iters=args.warmup,
        timed_iters=args.iters, seconds=args.seconds, device=args.device, threads=args.threads)
    workdir = Path(args.workdir) if args.workdir else (
        Path.cwd() / f"hadar-profile-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")

    def say(text: str) -> None:
        print(f"{PROG}: {text}", file=sys.stderr, flush=True)

    store = None if args.no_record else _store(args)
    try:
        outcomes = profile_on_slurm(
            runner, request, store=store, workdir=workdir.absolute(), gpu_types=types or None,
            partition=config.partition, timeout_s=args.timeout, log=say)
    except SlurmError as exc:
        raise InputError(f"Slurm failed: {exc}") from None
    finally:
        if store is not None:
            store.close()
    if args.json:
        print(json.dumps([{"gpu_type": o.gpu_type, "job_id": o.job_id, "state": o.state,
                           "error": o.error, "recorded": o.entry is not None,
                           "result": None if o.result is None else o.result.to_json()}
                          for o in outcomes]))
    else:
        for outcome in outcomes:
            print(outcome.summary())
        where = "" if store is None else f" in {store.path}"
        print(f"{sum(o.entry is not None for o in outcomes)} of {len(outcomes)} GPU types "
              f"recorded{where}; job output in {workdir}")
    return 0 if all(o.result is not None for o in outcomes) else EXIT_SOME_FAILED


# ----------------------------------------------------------------------------------- parser

def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpus``, ``gres-conf`` and ``profile`` to the main parser's subcommands."""
    gpus = subparsers.add_parser(
        "gpus", help="list this node's GPUs through NVML",
        description="The GPUs NVML sees: name, memory, the type Slurm's AutoDetect=nvml gives "
        f"each, the short type, device file and UUID.  Exit {EXIT_NO_GPU} without NVML or GPUs.")
    gpus.add_argument("--json", action="store_true", help="print a JSON list")
    gpus.set_defaults(func=cmd_gpus)

    gres = subparsers.add_parser(
        "gres-conf", help="print this node's gres.conf and slurm.conf GPU lines",
        description="gres.conf lines (one per GPU type, File=/dev/nvidia[...]) and the "
        "slurm.conf Gres=/Feature= line of this node, from NVML.  Exit "
        f"{EXIT_NO_GPU} without NVML or GPUs.")
    gres.add_argument("--node", metavar="NAME",
                      help="the node's Slurm NodeName (default: the short host name)")
    gres.add_argument("--full-type", action="store_true",
                      help="use the full type AutoDetect=nvml gives (nvidia_a100-sxm4-80gb) "
                      "instead of the short one (a100)")
    gres.set_defaults(func=cmd_gres_conf)

    prof = subparsers.add_parser(
        "profile", help="measure a model's training throughput and record it",
        description="Train a built-in proxy of a model on synthetic data (warm-up, then timed "
        "iterations) through hadar's training runtime, and record the steps/s as measured in "
        "the throughput store; or, with --slurm, one job per GPU type of the cluster.")
    prof.add_argument("--model", required=True, choices=sorted(BENCHMARKS),
                      help="the model (the hints' short name)")
    prof.add_argument("--batch-size", type=_positive_int("--batch-size"), metavar="B",
                      help="the batch size hint (one the catalog has; none for a3c, cyclegan)")
    prof.add_argument("--gpus", type=_positive_int("--gpus"), default=1, metavar="N",
                      help="GPUs of the job, its scale factor (default: %(default)s)")
    prof.add_argument("--gpu-type", metavar="T",
                      help="record under this GPU type (required on the CPU to record); "
                      "with --slurm: profile only these types (comma-separated)")
    prof.add_argument("--device", metavar="DEV",
                      help="cpu, cuda or cuda:N (default: $HADAR_DEVICE, else CUDA when "
                      "available, else the CPU)")
    prof.add_argument("--warmup", type=_positive_int("--warmup", 0), default=DEFAULT_WARMUP,
                      metavar="N", help="untimed iterations first (default: %(default)s)")
    amount = prof.add_mutually_exclusive_group()
    amount.add_argument("--iters", type=_positive_int("--iters"), metavar="N",
                        help="timed iterations (default: 20)")
    amount.add_argument("--seconds", type=_seconds, metavar="S",
                        help="time iterations for this long instead")
    prof.add_argument("--threads", type=_positive_int("--threads"), metavar="N",
                      help="torch threads on the CPU (default: torch's)")
    prof.add_argument("--db", metavar="PATH", help=DB_HELP)
    prof.add_argument("--no-record", action="store_true", help="measure only")
    prof.add_argument("--json", action="store_true",
                      help="print the result as one JSON object (--slurm: a list)")
    prof.add_argument("--slurm", action="store_true",
                      help="submit one profiling job per GPU type of the cluster and wait")
    prof.add_argument("--config", metavar="FILE",
                      help="the sidecar's TOML config: record into its throughput store "
                      "and, with --slurm, submit with its [slurm] conf and partition "
                      "(default: $SLURM_CONF)")
    prof.add_argument("--workdir", metavar="DIR",
                      help="--slurm: where the job script and output go, a directory the nodes "
                      "share (default: ./hadar-profile-<time>-<pid>)")
    prof.add_argument("--timeout", type=_seconds, default=600.0, metavar="S",
                      help="--slurm: wait at most this long for the jobs, then cancel them "
                      "(default: %(default)g)")
    prof.set_defaults(func=cmd_profile)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="GPUs and profiling of hadar-slurm.")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hadar_slurm.cli.nvml``: these three commands alone, with the main CLI's
    handling of bad input (one line, exit 2)."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except InputError as exc:
        sys.stdout.flush()
        print(f"{PROG}: error: {exc.one_line()}".replace("\n", " "), file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
