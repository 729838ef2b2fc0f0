"""NVML: Slurm's type names, gres.conf formatting from fixed GPU lists, and the ``gpus`` /
``gres-conf`` commands on the machine the tests run on (a real NVML call: without a GPU they
must say so in one line and exit 3; with one, list it)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from hadar_slurm.cli.nvml import EXIT_NO_GPU, register
from hadar_slurm.errors import InputError
from hadar_slurm.rates.nvml import (
    GpuInfo,
    GpuSampler,
    NvmlUnavailable,
    device_files,
    gres_conf,
    list_gpus,
    short_type_name,
    slurm_type_name,
)

REPO = Path(__file__).resolve().parent.parent


def gpu(index: int, name: str, minor: int | None = None, *, mig: bool = False) -> GpuInfo:
    return GpuInfo(index=index, name=name, uuid=f"GPU-{index:08d}", memory_total_mib=81920,
                   minor_number=index if minor is None else minor,
                   slurm_type=slurm_type_name(name), mig=mig)


# NVML device names as nvidia-smi prints them, and what Slurm's gpu_nvml.c makes of them:
# lower case, every space an underscore, '-' kept.
@pytest.mark.parametrize(("name", "detected", "short"), [
    ("NVIDIA A100-SXM4-80GB", "nvidia_a100-sxm4-80gb", "a100"),
    ("Tesla V100-SXM2-16GB", "tesla_v100-sxm2-16gb", "v100"),
    ("Tesla P100-PCIE-16GB", "tesla_p100-pcie-16gb", "p100"),
    ("Tesla K80", "tesla_k80", "k80"),
    ("NVIDIA H100 80GB HBM3", "nvidia_h100_80gb_hbm3", "h100"),
    ("NVIDIA GeForce RTX 3090", "nvidia_geforce_rtx_3090", "rtx_3090"),
    ("Quadro RTX 6000", "quadro_rtx_6000", "rtx_6000"),
    ("NVIDIA L40S", "nvidia_l40s", "l40s"),
    ("NVIDIA", "nvidia", "nvidia"),
])
def test_type_names(name: str, detected: str, short: str) -> None:
    assert slurm_type_name(name) == detected
    assert short_type_name(name) == short
    # gres.conf(5): a configured Type must be a substring of the autodetected one
    assert short in detected


def test_device_files_are_ranges() -> None:
    assert device_files([3]) == "/dev/nvidia3"
    assert device_files([3, 0, 1, 2]) == "/dev/nvidia[0-3]"
    assert device_files([0, 1, 2, 3, 6]) == "/dev/nvidia[0-3,6]"
    assert device_files([0, 2, 4, 5]) == "/dev/nvidia[0,2,4-5]"
    with pytest.raises(ValueError):
        device_files([])


def test_gres_conf_one_type() -> None:
    gpus = [gpu(i, "NVIDIA A100-SXM4-80GB") for i in range(8)]
    text = gres_conf(gpus, "node4")
    lines = [x for x in text.splitlines() if x and not x.startswith("#")]
    assert lines == [
        "NodeName=node4 Name=gpu Type=a100 File=/dev/nvidia[0-7]  # 8 x nvidia_a100-sxm4-80gb",
        "NodeName=node4 Gres=gpu:a100:8 Feature=a100",
    ]
    full = gres_conf(gpus, "node4", full_type=True)
    assert "Type=nvidia_a100-sxm4-80gb File=/dev/nvidia[0-7]" in full
    assert "Gres=gpu:nvidia_a100-sxm4-80gb:8 Feature=nvidia_a100-sxm4-80gb" in full


def test_gres_conf_mixed_types_and_skipped_gpus() -> None:
    # NVML index order is not minor order: GPU 1 is /dev/nvidia3; GPU 4 has no minor number
    # (left out, as Slurm's autodetection skips it); GPU 5 is in MIG mode.
    gpus = [gpu(0, "Tesla V100-SXM2-16GB", 0), gpu(1, "Tesla V100-SXM2-16GB", 3),
            gpu(2, "Tesla T4", 1), gpu(3, "Tesla T4", 2),
            GpuInfo(4, "Tesla T4", "GPU-4", 15360, None, "tesla_t4"),
            gpu(5, "NVIDIA A100-SXM4-40GB", 5, mig=True)]
    text = gres_conf(gpus, "mixed01")
    lines = [x for x in text.splitlines() if x and not x.startswith("#")]
    assert lines == [
        "NodeName=mixed01 Name=gpu Type=v100 File=/dev/nvidia[0,3]  # 2 x tesla_v100-sxm2-16gb",
        "NodeName=mixed01 Name=gpu Type=t4 File=/dev/nvidia[1-2]  # 2 x tesla_t4",
        "NodeName=mixed01 Gres=gpu:v100:2,gpu:t4:2 Feature=v100,t4",
    ]
    assert "# GPU 4 (Tesla T4) has no /dev/nvidia minor number" in text
    assert "# GPU 5 (NVIDIA A100-SXM4-40GB) is in MIG mode" in text


def test_gres_conf_bad_input() -> None:
    with pytest.raises(InputError) as bad:
        gres_conf([gpu(0, "Tesla K80")], "node 1")
    assert bad.value.field == "node"
    with pytest.raises(InputError) as none:
        gres_conf([gpu(0, "NVIDIA A100-SXM4-40GB", mig=True)], "node1")
    assert none.value.field == "gpus"


def test_gpu_info_json() -> None:
    data = gpu(2, "Tesla K80", 7).to_json()
    assert data["device_file"] == "/dev/nvidia7"
    assert data["slurm_type"] == "tesla_k80" and data["short_type"] == "k80"
    assert data["memory_total_mib"] == 81920 and data["mig"] is False


# ------------------------------------------------------------------ the machine's real NVML

def _real_gpus() -> list[GpuInfo] | NvmlUnavailable:
    try:
        return list_gpus()
    except NvmlUnavailable as exc:
        return exc


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hadar-slurm")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


@pytest.mark.parametrize("argv", [["gpus"], ["gpus", "--json"], ["gres-conf", "--node", "n1"]])
def test_commands_on_this_machine(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    found = _real_gpus()
    args = _parser().parse_args(argv)
    status = args.func(args)
    out, err = capsys.readouterr()
    if isinstance(found, NvmlUnavailable):
        assert status == EXIT_NO_GPU
        assert out == ""
        assert err == f"hadar-slurm: {found}\n"  # one line naming what is missing
        assert found.reason in ("module", "library", "driver", "no-gpus")
    else:
        assert status == 0 and err == ""
        assert all(g.slurm_type in out for g in found)


def test_gpus_subprocess_no_traceback() -> None:
    """As a user runs it: one line on stderr and exit 3 without a GPU, never a traceback."""
    found = _real_gpus()
    proc = subprocess.run([sys.executable, "-m", "hadar_slurm.cli.nvml", "gpus"],
                          capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert "Traceback" not in proc.stderr
    if isinstance(found, NvmlUnavailable):
        assert proc.returncode == EXIT_NO_GPU
        assert proc.stderr.count("\n") == 1 and "NVML" in proc.stderr
    else:
        assert proc.returncode == 0 and found[0].name in proc.stdout


def test_sampler_on_this_machine() -> None:
    found = _real_gpus()
    sampler = GpuSampler(interval_s=0.05)
    if isinstance(found, NvmlUnavailable):
        with pytest.raises(NvmlUnavailable) as exc:
            sampler.start()
        assert exc.value.reason == found.reason
        sampler.stop()  # harmless when it never started
        assert sampler.result() == ()
    else:
        with sampler:
            pass
        usage = sampler.result()
        assert len(usage) == len(found) and all(u.samples >= 2 for u in usage)


def test_sampler_rejects_bad_interval() -> None:
    with pytest.raises(ValueError):
        GpuSampler(interval_s=0)
