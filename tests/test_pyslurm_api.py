"""Unit tests of :mod:`hadar_slurm.slurm.pyslurm_api` against a FAKE pyslurm.

pyslurm cannot be installed here (PyPI has only 25.11.x, which builds only against Slurm 25.11;
this machine has Slurm 22.05), so these tests do not touch a real pyslurm.  The fake below is
shaped after pyslurm's source (repository PySlurm/pyslurm), and only as far as the mapping reads:

- ``pyslurm/core/job/job.pyx``: ``Jobs.load()`` (a multi-cluster map, see
  ``pyslurm/xcollections.pyx``: iterating yields keys, ``values()`` the jobs of all clusters);
  ``Job(job_id)`` with ``modify(changes)``, ``hold(mode=None)``, ``release()``,
  ``requeue(hold=False)``, ``send_signal(signal, steps="children", hurry=False)``, ``cancel()``;
  attributes ``id``, ``name``, ``user_name``, ``user_id``, ``state`` (``job_state_string``: a
  flag such as ``REQUEUE_HOLD`` replaces the base state), ``state_reason``, ``partition``,
  ``allocated_nodes``, ``required_nodes``, ``constraints`` (a list, ``cstr.to_list``),
  ``comment``, ``admin_comment``, ``gres_per_node`` (``cstr.to_gres_dict``: ``{"gpu:v100": 2}``),
  ``priority``, ``submit_time``, ``start_time``, ``time_limit`` (minutes; None when unset or
  unlimited, ``ctime._raw_time``).
- ``pyslurm/core/job/submission.pyx``: ``JobSubmitDescription(**kwargs)`` (a cdef class: unknown
  attributes raise).
- ``pyslurm/core/node.pyx``: ``Nodes.load()``; ``Node`` attributes ``name``, ``state``
  (``node_state_string_complete``: ``"MIXED+DRAIN"``), ``configured_gres``, ``allocated_gres``
  (``{"gpu:v100": {"count": 2, "indexes": "0-1"}}`` for ``gpu:v100:2(IDX:0-1)``),
  ``available_features``, ``active_features``, ``total_cpus``, ``allocated_cpus``,
  ``real_memory``, ``partitions``.
- ``pyslurm/core/error.pyx``: ``RPCError(errno, msg)``.
- ``pyslurm/core/slurmctld/config.pyx``: ``slurmctld.Config.load()``, whose ``version`` is
  slurmctld's release (``"25.11.2"``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import cast

import pytest

import hadar_slurm.cli.main as cli
from hadar_slurm.slurm import (
    Gres,
    RunAs,
    SlurmCommandError,
    SlurmConfigError,
    SlurmError,
    SlurmParseError,
    SlurmRunner,
    parse_sinfo_json,
    parse_squeue_json,
)
from hadar_slurm.slurm.api import CliApi, SlurmApi
from hadar_slurm.slurm.pyslurm_api import (
    PyslurmApi,
    PyslurmMismatchError,
    PyslurmUnsupportedError,
    make_api,
    pyslurm_available,
)

# ------------------------------------------------------------------------------ the fake


class FakeRPCError(Exception):
    """pyslurm.RPCError (error.pyx): ``errno`` and ``msg``."""

    def __init__(self, errno: int = 2017, msg: str = "Invalid job id specified") -> None:
        self.errno = errno
        self.msg = msg
        super().__init__(msg)


class FakeCollection:
    """pyslurm.xcollections.MultiClusterMap: ``{cluster: {key: item}}``."""

    def __init__(self, items: dict[object, object], cluster: str = "linux") -> None:
        self.data = {cluster: items}

    def __iter__(self) -> Iterator[object]:  # keys, as MultiClusterMap does
        for items in self.data.values():
            yield from items

    def values(self) -> Iterator[object]:
        for items in self.data.values():
            yield from items.values()


class FakeJobSubmitDescription:
    """The attributes of submission.pyx that matter here; others raise, as on a cdef class."""

    ATTRS = frozenset({"required_nodes", "constraints", "admin_comment", "gres_per_node",
                       "nodes", "priority", "time_limit", "comment", "dependencies"})

    def __init__(self, **kwargs: object) -> None:
        for key in kwargs:
            if key not in self.ATTRS:
                raise AttributeError(f"JobSubmitDescription has no attribute {key!r}")
        self.kwargs = kwargs


class FakePyslurm(ModuleType):
    """A module object standing in for ``pyslurm``; records the calls made on ``Job``."""

    def __init__(self, jobs: list[SimpleNamespace] | None = None,
                 nodes: list[SimpleNamespace] | None = None) -> None:
        super().__init__("pyslurm")
        self.__version__ = "25.11.0"
        self.slurm_release = "25.11.2"  # slurmctld's, as slurmctld.Config.load() reports it
        self.calls: list[tuple[int, str, tuple[object, ...], dict[str, object]]] = []
        self.fail: FakeRPCError | None = None
        self.RPCError = FakeRPCError
        self.JobSubmitDescription = FakeJobSubmitDescription
        fake = self
        job_list = jobs or []
        node_list = nodes or []

        def act(job_id: int, method: str, *args: object, **kwargs: object) -> None:
            fake.calls.append((job_id, method, args, kwargs))
            if fake.fail is not None:
                raise fake.fail

        class Job:
            def __init__(self, job_id: int) -> None:
                self.id = job_id

            def modify(self, changes: FakeJobSubmitDescription) -> None:
                act(self.id, "modify", changes)

            def hold(self, mode: str | None = None) -> None:
                act(self.id, "hold", **({} if mode is None else {"mode": mode}))

            def release(self) -> None:
                act(self.id, "release")

            def requeue(self, hold: bool = False) -> None:
                act(self.id, "requeue", hold=hold)

            def send_signal(self, signal: str | int, steps: str = "children",
                            hurry: bool = False) -> None:
                act(self.id, "send_signal", signal, steps=steps)

            def cancel(self) -> None:
                act(self.id, "cancel")

        class Jobs:
            @staticmethod
            def load() -> FakeCollection:
                if fake.fail is not None:
                    raise fake.fail
                return FakeCollection({j.id: j for j in job_list})

        class Nodes:
            @staticmethod
            def load() -> FakeCollection:
                if fake.fail is not None:
                    raise fake.fail
                return FakeCollection({n.name: n for n in node_list})

        class Config:
            @staticmethod
            def load() -> SimpleNamespace:
                if fake.fail is not None:
                    raise fake.fail
                return SimpleNamespace(version=fake.slurm_release)

        self.Job = Job
        self.Jobs = Jobs
        self.Nodes = Nodes
        self.slurmctld = SimpleNamespace(Config=Config)


def held_job() -> SimpleNamespace:
    """A pending job held by the sidecar (``scontrol hold``: priority 0)."""
    return SimpleNamespace(
        id=3, name="held", user_name="alice", user_id=1000, state="PENDING",
        state_reason="JobHeldAdmin", partition="gpu", allocated_nodes=None,
        required_nodes="node3", constraints=["k80"], comment=None,
        admin_comment="hadar:placed=node3", gres_per_node={"gpu:k80": 1},
        submit_time=1_700_000_000, start_time=None, time_limit=60, priority=0,
        cluster="linux", account="proj-7", qos="normal", memory_per_node=16000,
        memory_per_cpu=None, min_cpus_per_node=6)


def running_job() -> SimpleNamespace:
    return SimpleNamespace(
        id=7, name="train-v100", user_name="bob", user_id=1001, state="RUNNING",
        state_reason="None", partition="gpu", allocated_nodes="node[1-2]",
        required_nodes="node[1-2]", constraints=["v100|p100"], comment="hadar:job=7",
        admin_comment=None, gres_per_node={"gpu:v100": 2}, submit_time=1_700_000_100,
        start_time=1_700_000_200, time_limit=None, priority=4294901759, cluster="linux")


def gpu_node() -> SimpleNamespace:
    return SimpleNamespace(
        name="node1", state="MIXED+DRAIN", configured_gres={"gpu:v100": 4},
        allocated_gres={"gpu:v100": {"count": 2, "indexes": "0-1"}},
        available_features=["v100", "nvlink"], active_features=["v100"], total_cpus=32,
        allocated_cpus=8, real_memory=128000, partitions=["gpu", "debug"])


@pytest.fixture
def fake() -> FakePyslurm:
    return FakePyslurm([held_job(), running_job()], [gpu_node()])


@pytest.fixture
def api(fake: FakePyslurm) -> PyslurmApi:
    return PyslurmApi(module=fake)


# ------------------------------------------------------------------------------ reads


def test_read_jobs_maps_a_held_and_a_running_job(api: PyslurmApi) -> None:
    jobs = {j.job_id: j for j in api.read_jobs()}
    assert api.commands == 1 and sorted(jobs) == [3, 7]

    held = jobs[3]
    assert held.state == "PENDING" and held.state_flags == () and held.held
    assert held.state_reason == "JobHeldAdmin" and held.priority == 0
    assert held.nodes == "" and held.node_names == ()
    assert held.gres == (Gres("gpu", "k80", 1),) and held.features == "k80"
    assert held.admin_comment == "hadar:placed=node3" and held.comment == ""
    assert held.submit_time == 1_700_000_000 and held.start_time is None
    assert held.time_limit_min == 60 and held.user == "alice"
    assert (held.account, held.qos, held.mem_per_node_mb, held.mem_per_cpu_mb,
            held.cpus_per_node) == ("proj-7", "normal", 16000, None, 6)

    run = jobs[7]
    assert run.state == "RUNNING" and not run.held
    assert run.nodes == "node[1-2]" and run.node_names == ("node1", "node2")
    assert run.gres == (Gres("gpu", "v100", 2),) and run.gpu_type == "v100"
    assert run.gpus_per_node == 2 and run.features == "v100|p100"
    assert run.time_limit_min is None and run.start_time == 1_700_000_200


def test_job_mapping_equals_the_cli_parser_on_the_same_job(api: PyslurmApi) -> None:
    """The same held job as ``squeue --json`` (22.05) prints it parses to the same SlurmJob."""
    squeue = {"jobs": [{
        "job_id": 3, "name": "held", "user_name": "alice", "job_state": "PENDING",
        "state_reason": "JobHeldAdmin", "partition": "gpu", "nodes": "",
        "tres_per_node": "gres:gpu:k80:1", "features": "k80", "comment": "",
        "admin_comment": "hadar:placed=node3", "priority": 0, "submit_time": 1_700_000_000,
        "start_time": 0, "time_limit": 60, "user_id": 1000, "account": "proj-7",
        "qos": "normal", "memory_per_node": 16000, "memory_per_cpu": None,
        "minimum_cpus_per_node": 6,
    }]}
    (cli,) = parse_squeue_json(squeue)
    mine = next(j for j in api.read_jobs() if j.job_id == 3)
    assert mine == cli


def test_read_nodes_maps_gres_features_and_state(api: PyslurmApi) -> None:
    (node,) = api.read_nodes()
    assert api.commands == 1
    assert node.name == "node1" and node.state == "MIXED" and node.state_flags == ("DRAIN",)
    assert node.gres == (Gres("gpu", "v100", 4),) and node.gpus == 4
    assert node.gres_used == (Gres("gpu", "v100", 2),) and node.gpus_used == 2
    assert node.features == ("v100", "nvlink") and node.active_features == ("v100",)
    assert (node.cpus, node.alloc_cpus, node.real_memory_mb) == (32, 8, 128000)
    assert node.partitions == ("gpu", "debug")

    sinfo = {"nodes": [{
        "name": "node1", "state": "mixed", "state_flags": ["DRAIN"],
        "gres": "gpu:v100:4(S:0-1)", "gres_used": "gpu:v100:2(IDX:0-1)",
        "features": "v100,nvlink", "active_features": "v100", "cpus": 32, "alloc_cpus": 8,
        "real_memory": 128000, "partitions": ["gpu", "debug"],
    }]}
    assert parse_sinfo_json(sinfo) == (node,)


@pytest.mark.parametrize(("gres", "expected"), [
    ({"gpu": 2}, (Gres("gpu", None, 2),)),
    ({"gres/gpu:a100": 4}, (Gres("gpu", "a100", 4),)),  # key of Slurm 23.02+ "gres/gpu:a100:4"
    ({"gpu:v100": {"count": "1", "indexes": "0"}}, (Gres("gpu", "v100", 1),)),
    ({"gpu:v100": SimpleNamespace(count=3)}, (Gres("gpu", "v100", 3),)),
    ({}, ()),
    (None, ()),
])
def test_gres_shapes(fake: FakePyslurm, gres: object, expected: tuple[Gres, ...]) -> None:
    job = running_job()
    job.gres_per_node = gres
    (mapped,) = PyslurmApi(module=FakePyslurm([job])).read_jobs()
    assert mapped.gres == expected


@pytest.mark.parametrize(("state", "base", "flags"), [
    ("REQUEUE_HOLD", "PENDING", ("REQUEUE_HOLD",)),
    ("REQUEUED", "PENDING", ("REQUEUED",)),
    ("CONFIGURING", "RUNNING", ("CONFIGURING",)),
    ("COMPLETING", "COMPLETING", ()),  # base state unknown: kept as Slurm 22.05's squeue does
    ("completed", "COMPLETED", ()),
])
def test_job_state_flags(state: str, base: str, flags: tuple[str, ...]) -> None:
    job = held_job()
    job.state = state
    job.state_reason = "JobHeldUser"
    (mapped,) = PyslurmApi(module=FakePyslurm([job])).read_jobs()
    assert (mapped.state, mapped.state_flags) == (base, flags)
    assert mapped.held == (base == "PENDING")


def test_slurmctlds_hold_after_a_failed_launch_reads_as_squeue_gives_it() -> None:
    # pyslurm gives the description in place of the reason code; squeue --json gives both
    failed, other = held_job(), held_job()
    failed.state_reason = "launch failed requeued held"
    other.state_reason = "job requeued in held state"
    (a,) = PyslurmApi(module=FakePyslurm([failed])).read_jobs()
    assert (a.state_reason, a.state_desc, a.held) == (
        "JobHeldUser", "launch failed requeued held", True)
    (b,) = PyslurmApi(module=FakePyslurm([other])).read_jobs()
    assert (b.state_reason, b.state_desc) == ("job requeued in held state", "")


def test_user_falls_back_to_uid_and_unlimited_numbers() -> None:
    job = running_job()
    job.user_name = None
    job.priority = "UNLIMITED"  # u32_parse's on_inf
    (mapped,) = PyslurmApi(module=FakePyslurm([job])).read_jobs()
    assert mapped.user == "1001" and mapped.priority is None


def test_unreadable_attribute_names_the_job_and_field() -> None:
    job = running_job()
    job.gres_per_node = {"gpu:v100": "many"}
    with pytest.raises(SlurmParseError, match=r"pyslurm: job 7: field 'gres_per_node'"):
        PyslurmApi(module=FakePyslurm([job])).read_jobs()


# ------------------------------------------------------------------------------ actions


def test_update_job_maps_scontrol_fields(api: PyslurmApi, fake: FakePyslurm) -> None:
    api.update_job(7, {"NodeList": "node2", "Features": "p100", "AdminComment": "hadar:x",
                       "TresPerNode": "gres:gpu:v100:2", "Dependency": "afterany:42"})
    assert api.commands == 1
    ((job_id, method, args, kwargs),) = fake.calls
    assert (job_id, method, kwargs) == (7, "modify", {})
    (desc,) = args
    assert isinstance(desc, FakeJobSubmitDescription)
    assert desc.kwargs == {"required_nodes": "node2", "constraints": "p100",
                           "admin_comment": "hadar:x", "gres_per_node": {"gpu:v100": 2},
                           "dependencies": "afterany:42"}


def test_update_job_untyped_gres(api: PyslurmApi, fake: FakePyslurm) -> None:
    api.update_job(7, {"TresPerNode": "gres:gpu:2"})
    desc = cast(FakeJobSubmitDescription, fake.calls[0][2][0])
    assert desc.kwargs == {"gres_per_node": {"gpu": 2}}


@pytest.mark.parametrize("fields", [
    {"NumNodes": "2"},
    {"NodeList": "node1", "NumNodes": "1"},
    {"Features": ""},
    {"TresPerNode": "none"},
])
def test_update_job_what_pyslurm_cannot_set(
    api: PyslurmApi, fake: FakePyslurm, fields: dict[str, str],
) -> None:
    with pytest.raises(PyslurmUnsupportedError, match="use the 'cli' backend"):
        api.update_job(7, fields)
    assert api.commands == 0 and fake.calls == []


def test_update_job_rejects_unknown_fields_and_bad_ids(api: PyslurmApi) -> None:
    with pytest.raises(ValueError, match="unsupported fields"):
        api.update_job(7, {"TimeLimit": "10"})
    with pytest.raises(ValueError, match="at least one field"):
        api.update_job(7, {})
    with pytest.raises(ValueError, match="positive int"):
        api.hold(0)
    assert api.commands == 0


def test_job_actions_call_the_right_methods(api: PyslurmApi, fake: FakePyslurm) -> None:
    api.hold(3)
    api.release(3)
    api.requeue_hold(7)
    api.signal(7, "USR1")
    api.signal(7, "SIGTERM")
    api.signal(7, "10")
    api.cancel(7)
    assert fake.calls == [
        (3, "hold", (), {}),  # admin hold, as `scontrol hold` by the operator
        (3, "release", (), {}),
        (7, "requeue", (), {"hold": False}),  # a plain requeue, then the operator's hold
        (7, "hold", (), {}),
        (7, "send_signal", ("SIGUSR1",), {"steps": "all"}),  # all steps and the batch script
        (7, "send_signal", ("SIGTERM",), {"steps": "all"}),
        (7, "send_signal", ("10",), {"steps": "all"}),
        (7, "cancel", (), {}),
    ]
    assert api.commands == 8  # (the requeue-hold is two calls)


def test_unknown_signal_is_refused_before_the_call(api: PyslurmApi) -> None:
    with pytest.raises(ValueError, match="unknown signal"):
        api.signal(7, "NOPE")
    assert api.commands == 0


def test_rpc_error_becomes_slurm_command_error(api: PyslurmApi, fake: FakePyslurm) -> None:
    fake.fail = FakeRPCError(2017, "Invalid job id specified")
    with pytest.raises(SlurmCommandError) as info:
        api.hold(123)
    assert info.value.argv == ("pyslurm", "Job.hold", "123")
    assert "Invalid job id specified" in str(info.value) and "errno 2017" in str(info.value)
    assert isinstance(info.value.__cause__, FakeRPCError)

    with pytest.raises(SlurmCommandError) as info:
        api.read_jobs()
    assert info.value.argv == ("pyslurm", "Jobs.load")
    with pytest.raises(SlurmCommandError) as info:
        api.update_job(5, {"AdminComment": "x"})
    assert info.value.argv == ("pyslurm", "Job.modify", "5", "AdminComment=x")
    assert api.commands == 3  # failed calls were issued, so they count


# ------------------------------------------------------------------------------ backend choice


Runners = tuple[list[SlurmRunner], Callable[[], SlurmRunner]]


@pytest.fixture
def runner_factory(tmp_path: Path) -> Runners:
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    made: list[SlurmRunner] = []

    def factory() -> SlurmRunner:
        made.append(SlurmRunner(conf))
        return made[-1]

    return made, factory


def block_pyslurm(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import pyslurm` raise ImportError, installed or not.
    monkeypatch.setitem(sys.modules, "pyslurm", cast(ModuleType, None))


def test_make_api_auto_with_pyslurm(
    monkeypatch: pytest.MonkeyPatch, runner_factory: Runners,
) -> None:
    fake = FakePyslurm([held_job()])
    monkeypatch.setitem(sys.modules, "pyslurm", fake)
    made, factory = runner_factory
    assert pyslurm_available()
    api = make_api("auto", factory)
    assert isinstance(api, PyslurmApi) and api.name == "pyslurm" and made == []
    assert api.version == "25.11.0" and [j.job_id for j in api.read_jobs()] == [3]
    assert isinstance(make_api("pyslurm", factory), PyslurmApi)


def test_make_api_auto_without_pyslurm(
    monkeypatch: pytest.MonkeyPatch, runner_factory: Runners,
) -> None:
    block_pyslurm(monkeypatch)
    made, factory = runner_factory
    assert not pyslurm_available()
    api = make_api("auto", factory)
    assert isinstance(api, CliApi) and api.runner is made[0]
    with pytest.raises(SlurmConfigError, match=r"pyslurm 25\.11, which builds and runs only "
                       r"against Slurm 25\.11"):
        make_api("pyslurm", factory)
    with pytest.raises(SlurmError, match="cannot be imported"):
        PyslurmApi()


def test_make_api_cli_and_unknown(
    monkeypatch: pytest.MonkeyPatch, runner_factory: Runners,
) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", FakePyslurm())
    made, factory = runner_factory
    api = make_api("cli", factory)
    assert isinstance(api, CliApi) and len(made) == 1
    with pytest.raises(ValueError, match="unknown Slurm backend 'slurmrestd'"):
        make_api("slurmrestd", factory)


def uses_api(api: SlurmApi) -> tuple[str, int]:
    """Typed against the protocol: mypy checks that PyslurmApi satisfies SlurmApi."""
    return api.name, api.commands


def test_pyslurm_api_satisfies_the_protocol(api: PyslurmApi) -> None:
    assert uses_api(api) == ("pyslurm", 0)


def test_forks_go_through_the_slurm_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        runner_factory: Runners) -> None:
    """pyslurm cannot submit as another user nor hand out a pending job's script: the pyslurm
    backend forks through a CLI runner made on first use (stub ``scontrol``/``sbatch`` here),
    counting its commands; without one it cannot fork, and says why."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for name, out in (("scontrol", "#!/bin/sh\\necho train\\n"), ("sbatch", "77")):
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\nprintf "{out}"\n')
        stub.chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    monkeypatch.setenv("PATH", path)
    made, factory = runner_factory  # (a runner made now sees the stubs first on PATH)
    fake = FakePyslurm([held_job()])
    api = PyslurmApi(module=fake, fork_runner=factory)
    assert api.can_fork and made == []  # nothing made until a fork needs it
    assert api.batch_script(3) == "#!/bin/sh\necho train\n"
    me = RunAs(os.geteuid(), os.getegid(), (), {"PATH": path})
    assert api.submit_as("/t/fork.sbatch", me, dependency="afterany:5") == 77
    assert len(made) == 1 and api.commands == 2
    assert calls.read_text().splitlines() == [
        "scontrol write batch_script 3 -",
        "sbatch --parsable --dependency=afterany:5 /t/fork.sbatch",
    ]

    bare = PyslurmApi(module=fake)
    assert not bare.can_fork
    with pytest.raises(PyslurmUnsupportedError, match="forks \\(HadarE\\) go through the CLI"):
        bare.batch_script(3)
    with pytest.raises(PyslurmUnsupportedError, match="make_api"):
        bare.submit_as("/t/fork.sbatch", me)
    assert bare.commands == 0


def test_make_api_gives_pyslurm_a_runner_for_forks(
    monkeypatch: pytest.MonkeyPatch, runner_factory: Runners,
) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", FakePyslurm())
    made, factory = runner_factory
    for backend in ("auto", "pyslurm"):
        api = make_api(backend, factory)
        assert isinstance(api, PyslurmApi) and api.can_fork
    assert made == []


# ------------------------------------------------------------------------------ Slurm's version


def test_slurm_version_is_slurmctlds(api: PyslurmApi, fake: FakePyslurm) -> None:
    v = api.slurm_version()
    assert (v.release, v.series, v.tested) == ("25.11.2", "25.11", False)
    assert api.commands == 1
    fake.fail = FakeRPCError(1007, "Unable to contact slurm controller")
    with pytest.raises(SlurmCommandError) as info:
        api.slurm_version()
    assert info.value.argv == ("pyslurm", "slurmctld.Config.load")


@pytest.mark.parametrize(("release", "built"), [("24.11.5", "25.11.0"), ("25.11.2", "24.05.0"),
                                                ("25.11.2", "unknown")])
def test_pyslurm_for_another_slurm_is_one_line_naming_both(
        fake: FakePyslurm, release: str, built: str) -> None:
    fake.slurm_release, fake.__version__ = release, built
    with pytest.raises(PyslurmMismatchError) as info:
        PyslurmApi(module=fake).slurm_version()
    text = str(info.value)
    assert "\n" not in text and info.value.field == "[slurm] backend"
    assert f"pyslurm {built} (built for Slurm " in text
    assert f"talks to slurmctld of Slurm {release}" in text
    assert "pyslurm 25.11, which builds and runs only against Slurm 25.11" in text
    assert 'fix: set backend = "cli" under [slurm]' in text


def test_pyslurm_without_slurmctld_config_is_a_mismatch(fake: FakePyslurm) -> None:
    del fake.slurmctld
    with pytest.raises(PyslurmMismatchError, match=r"has no slurmctld\.Config"):
        PyslurmApi(module=fake).slurm_version()


def stub_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str, rc: int = 0) -> None:
    """``scontrol`` first on PATH: prints ``out``, exits ``rc``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "scontrol"
    stub.write_text(f"#!/bin/sh\nprintf '%s\\n' '{out}'\nexit {rc}\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_pyslurm_backend_without_pyslurm_names_the_slurm_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runner_factory: Runners) -> None:
    block_pyslurm(monkeypatch)
    stub_scontrol(tmp_path, monkeypatch, "slurm 24.11.5")
    _, factory = runner_factory
    with pytest.raises(PyslurmMismatchError) as info:
        make_api("pyslurm", factory)
    assert str(info.value).startswith("Slurm 24.11.5 found, but pyslurm cannot be imported (")
    # scontrol failing too: the line says what it can
    stub_scontrol(tmp_path, monkeypatch, "scontrol: fatal: no slurm.conf", rc=1)
    with pytest.raises(PyslurmMismatchError) as info:
        make_api("pyslurm", factory)
    assert str(info.value).startswith("pyslurm cannot be imported (")


def test_run_with_the_pyslurm_backend_and_no_pyslurm_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        clean_logger: None) -> None:
    block_pyslurm(monkeypatch)
    stub_scontrol(tmp_path, monkeypatch, "slurm 22.05.8")
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    config = tmp_path / "sidecar.toml"
    config.write_text(f'''[slurm]
conf = "{conf}"
backend = "pyslurm"
[sidecar]
state_dir = "{tmp_path / 'state'}"
log_file = "{tmp_path / 'sidecar.log'}"
''')
    assert cli.main(["run", "--config", str(config), "--once"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"hadar-slurm: error: {config}: field '[slurm] backend': Slurm "
                          "22.05.8 found, but pyslurm cannot be imported ("), err
    assert "only against Slurm 25.11" in err and 'set backend = "cli"' in err
