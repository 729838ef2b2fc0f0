"""Profiling on the CPU: real small models trained through the runtime, their rate recorded in a
temporary throughput store; warm-up left out of the timing; bad requests refused."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import pytest

from hadar_slurm.cli.nvml import register
from hadar_slurm.errors import InputError
from hadar_slurm.rates.profile import ProfileResult, profile_model
from hadar_slurm.rates.profile_models import BENCHMARKS, job_type_for
from hadar_slurm.rates.profile_slurm import ProfileRequest, _job_result, cluster_gpu_types
from hadar_slurm.rates.store import ThroughputStore
from hadar_slurm.runtime import EXIT_PREEMPTED
from hadar_slurm.slurm import Gres, SlurmNode

pytest.importorskip("torch")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hadar-slurm")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    status: int = args.func(args)
    return status


def test_profile_records_positive_throughput(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "throughputs.db"
    status = run(["profile", "--model", "resnet18", "--batch-size", "16", "--warmup", "2",
                  "--iters", "5", "--threads", "1", "--device", "cpu", "--gpu-type", "V100",
                  "--db", str(db), "--json"])
    out, err = capsys.readouterr()
    assert status == 0
    result = json.loads(out)
    assert result["device"] == "cpu" and result["timed_iters"] == 5
    assert result["recorded"]["gpu_type"] == "v100"
    with ThroughputStore(db) as store:
        entries = store.entries()
    assert len(entries) == 1
    entry = entries[0]
    assert (entry.job_type, entry.scale_factor, entry.gpu_type, entry.source) == (
        "ResNet-18 (batch size 16)", 1, "v100", "measured")
    assert entry.rate > 0
    assert entry.rate == pytest.approx(result["steps_per_second"])
    # the rate is the timed iterations over their wall time
    assert entry.rate == pytest.approx(5 / result["timed_seconds"], rel=1e-3)
    assert "recorded" in err and "measured on cpu" in err


def test_profile_config_records_into_the_sidecars_store(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text(f'[sidecar]\nstate_dir = "{tmp_path / "state"}"\n')
    status = run(["profile", "--model", "digits", "--batch-size", "32", "--warmup", "2",
                  "--iters", "5", "--threads", "1", "--device", "cpu", "--gpu-type", "k80",
                  "--config", str(config)])
    out, _ = capsys.readouterr()
    assert status == 0 and str(tmp_path / "state" / "throughputs.db") in out
    with ThroughputStore(tmp_path / "state" / "throughputs.db") as store:
        assert [(e.gpu_type, e.source) for e in store.entries()] == [("k80", "measured")]


def test_cpu_without_gpu_type_records_nothing(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "throughputs.db"
    status = run(["profile", "--model", "digits", "--batch-size", "32", "--iters", "10",
                  "--threads", "1", "--device", "cpu", "--db", str(db)])
    out, _ = capsys.readouterr()
    assert status == 0
    assert "steps/s" in out and "not recorded" in out
    assert not db.exists()


def test_warmup_is_not_timed() -> None:
    """Slow warm-up iterations (0.2 s each) leave the measured time alone; the same delay in a
    timed iteration shows up in it."""
    seen: list[int] = []

    def slow_warmup(i: int) -> None:
        seen.append(i)
        if i < 3:
            time.sleep(0.2)

    result = profile_model("digits", 32, device="cpu", warmup_iters=3, timed_iters=20,
                           threads=1, on_iteration=slow_warmup)
    assert seen == list(range(23))
    assert result.warmup_iters == 3 and result.timed_iters == 20
    assert result.timed_seconds < 0.2
    assert result.iter_ms_max < 200

    def slow_timed(i: int) -> None:
        if i == 5:
            time.sleep(0.2)

    control = profile_model("digits", 32, device="cpu", warmup_iters=3, timed_iters=20,
                            threads=1, on_iteration=slow_timed)
    assert control.timed_seconds >= 0.2
    assert control.iter_ms_max >= 200
    assert control.steps_per_second < result.steps_per_second


def test_seconds_mode_runs_until_the_time_is_up() -> None:
    result = profile_model("digits", 16, device="cpu", warmup_iters=1, seconds=0.3, threads=1)
    assert result.timed_seconds >= 0.3
    assert result.timed_iters >= 1
    assert result.steps_per_second == pytest.approx(result.timed_iters / result.timed_seconds)
    assert result.iter_ms_p50 <= result.iter_ms_p90 <= result.iter_ms_max


@pytest.mark.parametrize("model", sorted(BENCHMARKS))
def test_every_benchmark_trains(model: str) -> None:
    sizes = {"resnet18": 16, "resnet50": 16, "transformer": 16, "lm": 5,
             "recommendation": 512, "digits": 8}
    result = profile_model(model, sizes.get(model), device="cpu", warmup_iters=1,
                           timed_iters=2, threads=1)
    assert result.steps_per_second > 0 and result.timed_iters == 2
    assert result.job_type == job_type_for(model, sizes.get(model))


def test_preemption_signal_stops_profiling_like_training() -> None:
    """The runtime's preemption handling: SIGUSR1 mid-run ends the profile with exit 75."""
    def preempt(i: int) -> None:
        if i == 4:
            os.kill(os.getpid(), signal.SIGUSR1)

    with pytest.raises(SystemExit) as stop:
        profile_model("digits", 32, device="cpu", warmup_iters=2, timed_iters=50, threads=1,
                      on_iteration=preempt)
    assert stop.value.code == EXIT_PREEMPTED


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"model": "vgg16", "batch_size": 32}, "model"),
    ({"model": "resnet18", "batch_size": 17}, "batch-size"),
    ({"model": "resnet18", "batch_size": None}, "batch-size"),
    ({"model": "a3c", "batch_size": 16}, "batch-size"),
    ({"model": "digits", "batch_size": None}, "batch-size"),
    ({"model": "digits", "batch_size": 0}, "batch-size"),
    ({"model": "a3c", "batch_size": None, "gpus": 2}, "gpus"),
    ({"model": "resnet18", "batch_size": 16, "gpus": 2}, "gpus"),  # 2 GPUs on the CPU
    ({"model": "resnet18", "batch_size": 16, "timed_iters": 0}, "iters"),
    ({"model": "resnet18", "batch_size": 16, "warmup_iters": -1}, "warmup"),
    ({"model": "resnet18", "batch_size": 16, "seconds": 0.0}, "seconds"),
    ({"model": "resnet18", "batch_size": 16, "timed_iters": 3, "seconds": 1.0}, "iters"),
    ({"model": "resnet18", "batch_size": 16, "device": "tpu"}, "device"),
])
def test_bad_requests(kwargs: dict[str, object], field: str) -> None:
    kwargs.setdefault("device", "cpu")
    with pytest.raises(InputError) as bad:
        profile_model(**kwargs)  # type: ignore[arg-type]
    assert bad.value.field == field


def test_bad_batch_size_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InputError) as bad:
        run(["profile", "--model", "transformer", "--batch-size", "48", "--device", "cpu"])
    assert "choose 16, 32, 64, 128, 256" in str(bad.value)
    with pytest.raises(SystemExit):  # argparse: not a positive whole number
        run(["profile", "--model", "transformer", "--batch-size", "0"])
    assert "--batch-size" in capsys.readouterr().err


def test_result_json_round_trip_and_checks() -> None:
    result = profile_model("digits", 8, device="cpu", warmup_iters=0, timed_iters=3, threads=1)
    data = json.loads(json.dumps(result.to_json()))
    back = ProfileResult.from_json(data)
    assert back.job_type == result.job_type and back.timed_iters == 3
    assert back.steps_per_second == pytest.approx(result.steps_per_second, rel=1e-5)
    with pytest.raises(InputError):
        ProfileResult.from_json({**data, "steps_per_second": 0})
    with pytest.raises(InputError):
        ProfileResult.from_json({"model": "digits"})


def test_job_argv_is_an_argv() -> None:
    argv = ProfileRequest("resnet50", 64, warmup_iters=3, seconds=2.5).argv("a100")
    assert argv[1:5] == ["-m", "hadar_slurm.cli.nvml", "profile", "--model"]
    assert argv[argv.index("--gpu-type") + 1] == "a100"
    assert argv[argv.index("--seconds") + 1] == "2.5"
    assert "--no-record" in argv and "--json" in argv and "--iters" not in argv
    assert all(" " not in a for a in argv[1:])  # one option or value per element


def _node(name: str, gres: str, state: str = "IDLE", flags: tuple[str, ...] = ()) -> SlurmNode:
    kind, count = gres.split(":")
    return SlurmNode(name=name, state=state, state_flags=flags,
                     gres=(Gres("gpu", kind, int(count)),), gres_used=(), features=(kind,),
                     active_features=(kind,), cpus=4, alloc_cpus=0, real_memory_mb=4000,
                     partitions=("gpu",))


def test_cluster_gpu_types() -> None:
    nodes = [_node("n1", "V100:4"), _node("n2", "k80:2"), _node("n3", "a100:8", "DOWN"),
             _node("n4", "p100:4", flags=("DRAIN",)), _node("n5", "v100:8", "MIXED")]
    assert cluster_gpu_types(nodes, 1) == {"k80": 2, "v100": 8}
    assert cluster_gpu_types(nodes, 4) == {"v100": 8}
    assert cluster_gpu_types(nodes, 16) == {}


def test_job_result_from_output_files(tmp_path: Path) -> None:
    out, err = tmp_path / "job.out", tmp_path / "job.err"
    result = profile_model("digits", 8, device="cpu", warmup_iters=0, timed_iters=2, threads=1)
    out.write_text("some log line\n" + json.dumps({**result.to_json(), "recorded": None}) + "\n")
    got, why = _job_result(out, err)
    assert why is None and got is not None and got.timed_iters == 2
    out.write_text("no json here\n")
    err.write_text("hadar-slurm: error: field 'device': CUDA is not available here\n\n")
    got, why = _job_result(out, err)
    assert got is None and why is not None and "CUDA is not available" in why
    got, why = _job_result(tmp_path / "missing.out", tmp_path / "missing.err")
    assert got is None and why is not None and "no output file" in why
