"""GPU memory and sharing (issue #16): two jobs are offered to share a GPU only where their
memory footprints fit in the GPU's memory (:mod:`hadar_slurm.rates.memory`); footprints come
from ``profile`` (NVML, torch) and from running jobs' reports, through the throughput store.

Sizes are worked by hand: a v100 is taken for 16,384 MiB, of which 512 stay free, so two
footprints fit when they add up to 15,872 MiB or less."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path
from typing import Any

import pytest

from hadar_slurm.cli.main import main
from hadar_slurm.errors import InputError
from hadar_slurm.rates import nvml
from hadar_slurm.rates.learn import Knowledge
from hadar_slurm.rates.memory import HEADROOM_MIB, KNOWN_GPU_MIB, MemoryLimits
from hadar_slurm.rates.nvml import GpuSampler, GpuUsage
from hadar_slurm.rates.profile import ProfileResult, footprint_mib, record_result
from hadar_slurm.rates.store import ThroughputStore
from hadar_slurm.rates.table import ThroughputTable
from hadar_slurm.sidecar.fork import read_progress
from hadar_slurm.sim.cluster import parse_counts
from hadar_slurm.sim.run import simulate
from tests.helpers import make_job
from tests.test_hadar_sharing import hadar, table_with
from tests.test_learn import NOW, on, progress

V100 = 16384.0


def limits(**feet: float) -> MemoryLimits:
    return MemoryLimits({(job, 1): {"v100": mib} for job, mib in feet.items()})


def test_fits_by_hand() -> None:
    assert KNOWN_GPU_MIB["v100"] == V100 and HEADROOM_MIB == 512.0
    m = limits(x=8000.0, y=7872.0, big=9000.0)
    assert m.fits("x", "y", 1, "v100") is True  # 15,872 <= 16,384 - 512
    assert m.fits("x", "big", 1, "v100") is False  # 17,000
    assert "x (8000 MiB) and big (9000 MiB) need 17000 MiB; a v100 has 16384 MiB" in m.why_not(
        "x", "big", 1, "v100")
    assert m.why_not("x", "y", 1, "v100") == ""
    # unknown: a job never measured, a GPU type of unknown memory, another scale factor
    assert m.fits("x", "nobody", 1, "v100") is None
    assert m.fits("x", "y", 1, "mystery") is None
    assert m.fits("x", "y", 2, "v100") is None
    # a site's 32 GB V100s
    assert m.with_gpu_memory({"V100": 32768}, "cfg").fits("x", "big", 1, "v100") is True
    # measured on two types: the larger counts everywhere
    two = MemoryLimits({("x", 1): {"v100": 8000.0, "k80": 9000.0}})
    assert two.job_mib("x", 1) == 9000.0
    with pytest.raises(InputError, match=r"gpu_memory_mib\.v100"):
        m.with_gpu_memory({"v100": 0}, "cfg")


def test_a_pair_that_does_not_fit_is_forbidden_in_the_offered_table() -> None:
    base = table_with(0.8)
    assert base.colocated.pair_rate("x", "y", 1, "v100") == (0.8, 0.8)
    table = dataclasses.replace(base, memory=limits(x=9000.0, y=9000.0, c=100.0))
    offered = table.colocated
    assert offered.pair_rate("x", "y", 1, "v100") == (0.0, 0.0)
    assert offered.pair_rate("y", "x", 1, "v100") == (0.0, 0.0)
    assert offered.memory_refused == frozenset({(("x", "y", 1), "v100"), (("y", "x", 1), "v100"),
                                                (("x", "x", 1), "v100")})
    # a and b have no footprint: the table's word stands
    assert offered.pair_rate("a", "b", 1, "v100") == (1.5, 0.5)
    # merging a table without footprints keeps them
    merged = table.merged(ThroughputTable({("x", 1): {"v100": 1.0}}, "more"))
    assert merged.colocated.pair_rate("x", "y", 1, "v100") == (0.0, 0.0)


def test_hadar_never_packs_a_pair_that_does_not_fit() -> None:
    # tests/test_hadar_sharing.py: x and y share one v100 and both end at 900 s; with
    # footprints of 9,000 MiB each they cannot: they take turns (720 and 1440).
    jobs = [make_job(0, 720, 0, "x"), make_job(1, 720, 0, "y")]
    fits = dataclasses.replace(table_with(0.8), memory=limits(x=7000.0, y=7000.0))
    r = simulate(jobs, parse_counts("v100=1"), fits, hadar())
    assert r.finish.tolist() == pytest.approx([900.0, 900.0])
    too_big = dataclasses.replace(table_with(0.8), memory=limits(x=9000.0, y=9000.0))
    r = simulate(jobs, parse_counts("v100=1"), too_big, hadar())
    assert r.finish.tolist() == [720.0, 1440.0] and r.packed == []


def test_store_keeps_footprints_and_gpu_memory(tmp_path: Path) -> None:
    with ThroughputStore(tmp_path / "t.db") as store:
        assert store.record_footprint("x", 1, "v100", 8000.0, when=10.0) == 8000.0
        # a running job's report only raises it ...
        assert store.record_footprint("x", 1, "v100", 7000.0, source="learned") == 8000.0
        assert store.record_footprint("x", 1, "v100", 8500.0, source="learned") == 8500.0
        # ... a profile run (measured, on purpose) replaces it
        assert store.record_footprint("x", 1, "v100", 6000.0) == 6000.0
        store.record_gpu_memory("V100", 32510.0)
        assert store.footprints() == {("x", 1): {"v100": 6000.0}}
        assert store.gpu_memory() == {"v100": 32510.0}
        table = store.table(table_with(0.8))
        assert table.memory.job_mib("x", 1) == 6000.0 and table.memory.memory_mib(
            "v100") == 32510.0
        with pytest.raises(InputError, match="mib"):
            store.record_footprint("x", 1, "v100", -5.0)
        with pytest.raises(InputError, match="measured or learned"):
            store.record_footprint("x", 1, "v100", 5.0, source="estimated")
        store.record("x", 1, "v100", 1.0)
        out = tmp_path / "export.json"
        store.export(out)
    data = json.loads(out.read_text())
    assert data["footprints"] == [{"job_type": "x", "scale_factor": 1, "gpu_type": "v100",
                                   "mib": 6000.0, "source": "measured", "updated":
                                   data["footprints"][0]["updated"]}]
    with ThroughputStore(tmp_path / "copy.db") as copy:
        copy.import_file(out)
        assert copy.footprints() == {("x", 1): {"v100": 6000.0}}
        assert copy.gpu_memory() == {"v100": 32510.0}
    bad = dict(data, footprints=[dict(data["footprints"][0], mib="lots")])
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with ThroughputStore(tmp_path / "bad.db") as other:
        with pytest.raises(InputError, match=r"footprints\[0\]\.mib"):
            other.import_file(tmp_path / "bad.json")
        assert other.entries() == []  # refused whole


def result(usage: tuple[GpuUsage, ...] = (), torch_peak: float | None = None) -> ProfileResult:
    return ProfileResult(model="resnet18", job_type="x", batch_size=32, scale_factor=1,
                         device="cuda:0" if usage or torch_peak else "cpu", device_name="gpu",
                         warmup_iters=1, timed_iters=10, timed_seconds=1.0,
                         steps_per_second=10.0, iter_ms_p50=100.0, iter_ms_p90=100.0,
                         iter_ms_max=100.0, gpu_usage=usage, torch_peak_mib=torch_peak)


def test_profile_footprint_and_what_it_records(tmp_path: Path) -> None:
    mine = GpuUsage(0, 5, 90.0, 99.0, 5000.0, 6100.0, 16160.0, 5900.0)
    everyone = GpuUsage(0, 5, 90.0, 99.0, 5000.0, 6100.0, 16160.0, None)
    assert footprint_mib(result((mine,))) == 5900.0  # what this process held
    assert footprint_mib(result((everyone,))) == 6100.0  # all processes: never too little
    assert footprint_mib(result((), torch_peak=4000.0)) == 4512.0  # plus a CUDA context
    assert footprint_mib(result()) is None  # the CPU
    with ThroughputStore(tmp_path / "t.db") as store:
        record_result(store, result((mine,)), "v100")
        assert store.footprints() == {("x", 1): {"v100": 5900.0}}
        assert store.gpu_memory() == {"v100": 16160.0}
        record_result(store, result(), "k80")
        assert store.footprints() == {("x", 1): {"v100": 5900.0}} and "k80" not in (
            store.gpu_memory())
    # a result written before these fields reads back
    old = result((mine,)).to_json()
    del old["gpu_usage"][0]["memory_total_mib"], old["gpu_usage"][0]["memory_own_max_mib"]
    assert ProfileResult.from_json(old).gpu_usage[0].memory_own_max_mib is None


class FakeNvml(types.SimpleNamespace):
    """pynvml with one GPU of 16,160 MiB: this process holds 3,000 MiB, then 4,000; another
    process 1,000 MiB."""

    class NVMLError(Exception):
        pass

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid
        self.calls = 0

    def nvmlInit(self) -> None:  # noqa: N802 (pynvml's names)
        pass

    def nvmlShutdown(self) -> None:  # noqa: N802 (pynvml's names)
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 (pynvml's names)
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:  # noqa: N802 (pynvml's names)
        return f"gpu{index}"

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:  # noqa: N802 (pynvml's names)
        return types.SimpleNamespace(gpu=50)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:  # noqa: N802 (pynvml's names)
        return types.SimpleNamespace(used=5000 * 2**20, total=16160 * 2**20)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:  # noqa: N802 (pynvml's names)
        self.calls += 1
        mine = 3000 if self.calls == 1 else 4000
        return [types.SimpleNamespace(pid=self.pid, usedGpuMemory=mine * 2**20),
                types.SimpleNamespace(pid=self.pid + 1, usedGpuMemory=1000 * 2**20)]


def test_sampler_reads_this_process_memory_and_the_total(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    fake = FakeNvml(os.getpid())
    monkeypatch.setattr(nvml, "_import_pynvml", lambda: fake)
    with GpuSampler([0], interval_s=60.0) as sampler:
        pass
    (usage,) = sampler.result()
    assert usage.memory_total_mib == 16160.0 and usage.memory_own_max_mib == 4000.0
    assert usage.memory_used_max_mib == 5000.0
    assert footprint_mib(result((usage,))) == 4000.0


def test_a_running_job_teaches_its_footprint(tmp_path: Path) -> None:
    resnet = "ResNet-50 (batch size 64)"
    tracker = tmp_path / "t"
    tracker.mkdir()
    (tracker / "progress.json").write_text(json.dumps({
        "done": 100, "copy_rates": [{"copy": 0, "gpu_type": None, "iters": 100, "seconds": 10,
                                     "iters_per_s": 10, "gpu_mem_mib": 7300.5}]}))
    read = read_progress(str(tracker))
    assert read is not None and read.gpu_mem == {0: 7300.5}
    with ThroughputStore(tmp_path / "t.db") as store:
        k = Knowledge(table_with(0.8), store)
        seen = dataclasses.replace(progress(2, 2, [(None, 100.0, 10.0)]), gpu_mem={0: 7300.5})
        k.observe(7, resnet, 1, seen, on("v100"), now=NOW)
        assert store.footprints() == {(resnet, 1): {"v100": 7300.5}}
        k.refresh()
        assert k.table.memory.job_mib(resnet, 1) == 7300.5
        # a report that fails the checks (Slurm runs it on a k80, it claims a v100) teaches
        # nothing
        lie = dataclasses.replace(progress(3, 3, [("v100", 100.0, 10.0)], run="8.0"),
                                  gpu_mem={0: 9999.0})
        k.observe(8, resnet, 1, lie, on("k80"), now=NOW)
        assert store.footprints() == {(resnet, 1): {"v100": 7300.5}}


def test_throughputs_memory_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "t.db"
    with ThroughputStore(db) as store:
        store.record("x", 1, "v100", 1.0)
        assert main(["throughputs", "memory", "--db", str(db)]) == 0
        assert "no footprints or GPU memory stored" in capsys.readouterr().out
        store.record_footprint("x", 1, "v100", 8000.0)
        store.record_footprint("x", 1, "k80", 8100.0)
        store.record_gpu_memory("v100", 16160.0)
    assert main(["throughputs", "memory", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "x x1: 8100 MiB per GPU (8100 MiB on k80, 8000 MiB on v100)" in out
    assert "GPU v100: 16160 MiB (measured)" in out
    assert main(["throughputs", "memory", "--db", str(db), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpu_memory"] == {"v100": 16160.0} and len(data["footprints"]) == 2
