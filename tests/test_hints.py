"""Job hints (hadar_slurm/hints.py): parsing, every kind of bad hint, the model catalog, the CLI,
and the catalog block of slurm_conf/job_submit.lua (which must be the generated one)."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from hadar_slurm.cli import hints as cli_hints
from hadar_slurm.errors import InputError
from hadar_slurm.hints import (
    HINT_KEYS,
    LUA_BEGIN,
    LUA_END,
    MAX_COMMENT_BYTES,
    MAX_ETA,
    MAX_GPUS,
    MAX_RUNGS,
    MAX_STEPS,
    MAX_VALUE_BYTES,
    MAX_WEIGHT,
    MIN_ETA,
    MIN_WEIGHT,
    HintError,
    Hints,
    ModelCatalog,
    is_hadar_comment,
    lua_catalog_block,
    parse_hints,
    quote,
    whole_number,
)
from hadar_slurm.rates.table import ThroughputTable, default_table, parse_csv
from tests.helpers import REPO

KNOWN = "a3c, cyclegan, lm, recommendation, resnet18, resnet50, transformer"
KEYS = ("keys: model, bs, steps, sync, weight, fork, preempt, share, study, rule, rungs, eta, "
        "metric, mode")
STEPS_MSG = "steps must be a whole number of iterations from 1 to 1000000000000, got "
WEIGHT_MSG = "weight must be a number from 0.001 to 1000, got "
FORK_MSG = ("fork must be a whole number from 1 to 16, got '{}' (e.g. fork=3, the most copies "
            "the job may be forked into)")


def test_is_hadar_comment() -> None:
    assert is_hadar_comment("hadar: model=a3c steps=1")
    assert is_hadar_comment("  \tHADAR:model=a3c")
    assert is_hadar_comment("Hadar:")
    assert not is_hadar_comment("hadar model=a3c")
    assert not is_hadar_comment("see hadar: later")
    assert not is_hadar_comment("")


def test_catalog_of_the_default_table() -> None:
    cat = ModelCatalog.default()
    assert cat.models() == tuple(KNOWN.split(", "))
    assert cat.batch_sizes("resnet50") == (16, 32, 64, 128)
    assert cat.batch_sizes("lm") == (5, 10, 20, 40, 80)
    assert cat.batch_sizes("a3c") == () and cat.batch_sizes("cyclegan") == ()
    assert cat.gpu_counts("resnet50", 64) == (1, 2, 4, 8)
    assert cat.gpu_counts("a3c", None) == (1,)
    assert cat.gpu_counts("recommendation", 512) == (1,)
    assert cat.job_type("resnet50", 64) == "ResNet-50 (batch size 64)"
    assert cat.job_type("transformer", 16) == "Transformer (batch size 16)"
    assert cat.job_type("cyclegan", None) == "CycleGAN"
    # every job type of the table is reachable, with its scale factors
    table = default_table()
    seen = {(cat.job_type(m, bs), n) for m in cat.models()
            for bs in (cat.batch_sizes(m) or (None,)) for n in cat.gpu_counts(m, bs)}
    assert seen == set(table.job_keys())


def test_catalog_lookup_errors() -> None:
    cat = ModelCatalog.default()
    with pytest.raises(HintError, match="unknown model 'bert'") as exc:
        cat.batch_sizes("bert")
    assert exc.value.field == "model"
    with pytest.raises(HintError, match=r"bs 65 not available for resnet50 \(choose 16, 32"):
        cat.gpu_counts("resnet50", 65)
    with pytest.raises(HintError, match="missing hint bs for resnet50"):
        cat.job_type("resnet50", None)
    with pytest.raises(HintError, match=r"a3c has no batch size \(remove bs=64\)"):
        cat.job_type("a3c", 64)


def test_catalog_from_a_custom_table() -> None:
    table = parse_csv(
        "job_type,scale_factor,gpu_type,steps_per_second\n"
        "My-Net (batch size 8),2,v100,1\nMy-Net (batch size 8),1,v100,1\nToy,1,k80,1\n", "t.csv")
    cat = ModelCatalog.from_table(table)
    assert cat.models() == ("mynet", "toy")
    assert cat.gpu_counts("mynet", 8) == (1, 2)
    hints = parse_hints("hadar: model=my_net bs=8 steps=5", cat, gpus=2)
    assert hints.job_type == "My-Net (batch size 8)"


@pytest.mark.parametrize("types, problem", [
    (["Net", "Net (batch size 8)"], "with and without a batch size"),
    (["Res-Net", "resnet"], "all have the short name 'resnet'"),
    (["---"], "gives no usable model name"),
    (["N" * 65], "gives no usable model name"),  # longer than any hint's value may be
])
def test_catalog_refuses_ambiguous_tables(types: list[str], problem: str) -> None:
    table = ThroughputTable({(t, 1): {"v100": 1.0} for t in types}, "bad.csv")
    with pytest.raises(InputError, match=re.escape(problem)) as exc:
        ModelCatalog.from_table(table)
    assert exc.value.source == "bad.csv"


@pytest.mark.parametrize("comment, expect", [
    ("hadar: model=resnet50 bs=64 steps=40000 sync=true",
     Hints("resnet50", 64, 40000, True, 1.0, "ResNet-50 (batch size 64)")),
    ("  HADAR:model=ResNet-18\tbs=16 steps=4_000 weight=.5",
     Hints("resnet18", 16, 4000, True, 0.5, "ResNet-18 (batch size 16)")),
    ("hadar: steps=7 sync=No model=a3c weight=2e1",
     Hints("a3c", None, 7, False, 20.0, "A3C")),
    ("hadar: model=recommendation bs=0512 steps=1 sync=0 weight=3.",
     Hints("recommendation", 512, 1, False, 3.0, "Recommendation (batch size 512)")),
    ("hadar: model=LM bs=80 steps=10 sync=YES",
     Hints("lm", 80, 10, True, 1.0, "LM (batch size 80)")),
    ("hadar:model=cyclegan steps=1_000_000 sync=1 weight=1.5E-1",
     Hints("cyclegan", None, 1_000_000, True, 0.15, "CycleGAN")),
    ("hadar: model=resnet50 bs=64 steps=40000 fork=3",
     Hints("resnet50", 64, 40000, True, 1.0, "ResNet-50 (batch size 64)", fork=3)),
    ("hadar: fork=1_6 model=a3c steps=1", Hints("a3c", None, 1, True, 1.0, "A3C", fork=16)),
    ("hadar: model=a3c steps=1 fork=01", Hints("a3c", None, 1, True, 1.0, "A3C")),
    ("hadar: model=a3c steps=1 share=no",
     Hints("a3c", None, 1, True, 1.0, "A3C", share=False)),
    ("hadar: share=TRUE model=resnet50 bs=64 steps=40000 sync=false",
     Hints("resnet50", 64, 40000, False, 1.0, "ResNet-50 (batch size 64)")),
    ("hadar: model=lm bs=5 steps=10 fork=2 preempt=checkpoint share=0",
     Hints("lm", 5, 10, True, 1.0, "LM (batch size 5)", fork=2, preempt="checkpoint",
           share=False)),
])
def test_good_hints(comment: str, expect: Hints) -> None:
    hints = parse_hints(comment)
    assert hints == expect
    assert parse_hints(hints.to_comment()) == hints  # the canonical form reads back
    assert ("fork=" in hints.to_comment()) == (hints.fork != 1)
    assert ("share=" in hints.to_comment()) == (not hints.share)


@pytest.mark.parametrize("value, share", [
    ("true", True), ("false", False), ("yes", True), ("no", False), ("1", True), ("0", False),
    ("True", True), ("FALSE", False), ("Yes", True), ("NO", False), ("nO", False),
])
def test_share_takes_the_values_of_sync(value: str, share: bool) -> None:
    assert parse_hints(f"hadar: model=a3c steps=1 share={value}").share is share
    assert parse_hints(f"hadar: model=a3c steps=1 sync={value}").sync is share


def test_share_defaults_to_true() -> None:
    hints = parse_hints("hadar: model=resnet50 bs=64 steps=40000")
    assert hints.share is True
    assert "share" not in hints.to_comment()  # the default is not written
    # a Hints made without it (as before the hint existed) may share too
    assert Hints("a3c", None, 1, True, 1.0, "A3C").share is True
    no = parse_hints("hadar: model=resnet50 bs=64 steps=40000 share=no")
    assert no.share is False and no.to_comment().endswith(" share=false")
    assert (no.sync, no.weight, no.fork, no.preempt) == (True, 1.0, 1, "")


# (comment, field, exact message)
BAD = [
    ("hadar:", "model", f"missing hint model (add model=NAME; known: {KNOWN})"),
    ("hadar: bs=64 steps=1", "model", f"missing hint model (add model=NAME; known: {KNOWN})"),
    ("hadar: model=resnet51 bs=64 steps=1", "model",
     f"unknown model 'resnet51' (known: {KNOWN})"),
    ("hadar: model=--- steps=1", "model", f"unknown model '---' (known: {KNOWN})"),
    ("hadar: model=resnet50 bs=65 steps=1", "bs",
     "bs 65 not available for resnet50 (choose 16, 32, 64, 128)"),
    ("hadar: model=resnet50 bs=6_4x steps=1", "bs",
     "bs must be a whole number, got '6_4x' (choose 16, 32, 64, 128)"),
    ("hadar: model=resnet50 steps=1", "bs",
     "missing hint bs for resnet50 (add bs=N; choose 16, 32, 64, 128)"),
    ("hadar: model=a3c bs=32 steps=1", "bs", "a3c has no batch size (remove bs=32)"),
    ("hadar: model=a3c", "steps",
     "missing hint steps (add steps=N, the number of training iterations)"),
    ("hadar: model=resnet50 bs=64 steps=-5", "steps",
     STEPS_MSG + "'-5' (e.g. steps=40000)"),
    ("hadar: model=a3c steps=0", "steps",
     STEPS_MSG + "'0' (e.g. steps=40000)"),
    ("hadar: model=a3c steps=1.5", "steps",
     STEPS_MSG + "'1.5' (e.g. steps=40000)"),
    ("hadar: model=a3c steps=1e4", "steps",
     STEPS_MSG + "'1e4' (e.g. steps=40000)"),
    ("hadar: model=a3c steps=1__000", "steps",
     STEPS_MSG + "'1__000' (e.g. steps=40000)"),
    ("hadar: model=a3c steps=_1", "steps",
     STEPS_MSG + "'_1' (e.g. steps=40000)"),
    ("hadar: model=a3c steps=1 sync=maybe", "sync",
     "sync must be true or false, got 'maybe' (true/false, yes/no or 1/0)"),
    ("hadar: model=a3c steps=1 share=maybe", "share",
     "share must be true or false, got 'maybe' (true/false, yes/no or 1/0)"),
    ("hadar: model=a3c steps=1 share=2", "share",
     "share must be true or false, got '2' (true/false, yes/no or 1/0)"),
    ("hadar: model=a3c steps=1 share=on", "share",
     "share must be true or false, got 'on' (true/false, yes/no or 1/0)"),
    ("hadar: model=a3c steps=1 share=n\x1b", "share",
     "share must be true or false, got 'n\\x1b' (true/false, yes/no or 1/0)"),
    ("hadar: model=a3c steps=1 share=", "share", "hint 'share' has no value (write share=true)"),
    ("hadar: model=a3c steps=1 share=no share=no", "share",
     "hint 'share' given twice (give it once)"),
    ("hadar: model=a3c steps=1 share=" + "n" * 65, "share",
     "hint 'share' has a value longer than 64 bytes (write share=true)"),
    ("hadar: model=a3c steps=1 Share=no", "hints", f"unknown hint 'Share' ({KEYS})"),
    ("hadar: model=a3c steps=1 weight=0", "weight",
     WEIGHT_MSG + "'0' (e.g. weight=2)"),
    ("hadar: model=a3c steps=1 weight=-1", "weight",
     WEIGHT_MSG + "'-1' (e.g. weight=2)"),
    ("hadar: model=a3c steps=1 weight=inf", "weight",
     WEIGHT_MSG + "'inf' (e.g. weight=2)"),
    ("hadar: model=a3c steps=1 weight=0x10", "weight",
     WEIGHT_MSG + "'0x10' (e.g. weight=2)"),
    ("hadar: model=a3c steps=1 weight=1e999", "weight",
     WEIGHT_MSG + "'1e999' (e.g. weight=2)"),
    ("hadar: model=a3c steps=1 weight=.", "weight",
     WEIGHT_MSG + "'.' (e.g. weight=2)"),
    ("hadar: model=a3c steps=1 fork=0", "fork", FORK_MSG.format("0")),
    ("hadar: model=a3c steps=1 fork=17", "fork", FORK_MSG.format("17")),
    ("hadar: model=a3c steps=1 fork=2.0", "fork", FORK_MSG.format("2.0")),
    ("hadar: model=a3c steps=1 fork=-2", "fork", FORK_MSG.format("-2")),
    ("hadar: model=a3c steps=1 fork=yes", "fork", FORK_MSG.format("yes")),
    ("hadar: model=a3c steps=1 fork=", "fork", "hint 'fork' has no value (write fork=N)"),
    ("hadar: model=a3c steps=1 fork=2 fork=3", "fork", "hint 'fork' given twice (give it once)"),
    ("hadar: model=a3c steps", "hints", f"hint 'steps' is not key=value ({KEYS})"),
    ("hadar: =a3c", "hints", f"hint '=a3c' is not key=value ({KEYS})"),
    ("hadar: model=a3c steps=1 gpus=2", "hints", f"unknown hint 'gpus' ({KEYS})"),
    ("hadar: Model=a3c steps=1", "hints", f"unknown hint 'Model' ({KEYS})"),
    ("hadar: model=a3c steps=1 steps=2", "steps", "hint 'steps' given twice (give it once)"),
    ("hadar: model=a3c steps=", "steps", "hint 'steps' has no value (write steps=N)"),
    ("hadar: model= steps=1", "model", "hint 'model' has no value (write model=NAME)"),
    ("not hadar", "hints",
     "comment does not start with 'hadar:' (write e.g. 'hadar: model=resnet50 bs=64 "
     "steps=40000')"),
]


@pytest.mark.parametrize("comment, field, message", BAD)
def test_bad_hints(comment: str, field: str, message: str) -> None:
    with pytest.raises(HintError) as exc:
        parse_hints(comment)
    assert (exc.value.field, str(exc.value)) == (field, message)
    assert isinstance(exc.value, InputError) and "\n" not in str(exc.value)


def test_first_problem_in_token_order_then_key_order() -> None:
    # syntax problems come first, in token order; then values in the order model, bs, steps,
    # sync, weight, fork, preempt, share, gpus (job_submit.lua reports the same one)
    with pytest.raises(HintError, match="unknown hint 'x'"):
        parse_hints("hadar: model=nope x=1 y")
    with pytest.raises(HintError, match="unknown model 'nope'"):
        parse_hints("hadar: weight=-1 model=nope")
    with pytest.raises(HintError, match=r"^steps"):
        parse_hints("hadar: weight=-1 sync=2 steps=0 model=a3c", gpus=3)
    with pytest.raises(HintError, match=r"^weight"):
        parse_hints("hadar: fork=99 weight=-1 model=a3c steps=1", gpus=3)
    with pytest.raises(HintError, match=r"^fork"):
        parse_hints("hadar: fork=99 model=a3c steps=1", gpus=3)
    with pytest.raises(HintError, match=r"^sync"):
        parse_hints("hadar: share=x sync=x model=a3c steps=1", gpus=3)
    with pytest.raises(HintError, match=r"^preempt"):
        parse_hints("hadar: share=x preempt=x model=a3c steps=1", gpus=3)
    with pytest.raises(HintError, match=r"^share"):
        parse_hints("hadar: share=x model=a3c steps=1", gpus=3)
    with pytest.raises(HintError, match=r"^a3c runs on 1 GPU"):
        parse_hints("hadar: share=no model=a3c steps=1", gpus=3)


def test_gpu_count_is_checked() -> None:
    assert parse_hints("hadar: model=resnet50 bs=64 steps=1", gpus=8).model == "resnet50"
    with pytest.raises(HintError) as exc:
        parse_hints("hadar: model=a3c steps=1", gpus=2)
    assert exc.value.field == "gpus"
    assert str(exc.value) == "a3c runs on 1 GPU; the job asks for 2 (use --gres=gpu:1)"
    with pytest.raises(HintError) as exc:
        parse_hints("hadar: model=lm bs=5 steps=1", gpus=3)
    assert str(exc.value) == ("lm bs=5 runs on 1, 2, 4 or 8 GPUs; the job asks for 3 "
                              "(use --gres=gpu:N with N one of 1, 2, 4, 8)")


def test_docs_list_the_keys_and_the_default_models() -> None:
    assert HINT_KEYS == ("model", "bs", "steps", "sync", "weight", "fork", "preempt", "share",
                         "study", "rule", "rungs", "eta", "metric", "mode")
    text = (REPO / "docs" / "users.md").read_text()
    for key in HINT_KEYS:
        assert f"| `{key}` |" in text
    cat = ModelCatalog.default()
    for model in cat.models():
        sizes = cat.batch_sizes(model)
        gpus = cat.gpu_counts(model, sizes[0] if sizes else None)
        assert all(cat.gpu_counts(model, bs) == gpus for bs in sizes)
        bs_text = ", ".join(map(str, sizes)) or "(none)"
        assert f"| `{model}` | {bs_text} | {', '.join(map(str, gpus))} |" in text


def test_whole_numbers_are_bounded_by_their_digits() -> None:
    assert whole_number("40_000", 10**12) == 40000
    assert whole_number("0" * 60 + "7", 10) == 7
    assert whole_number("000", 10) == 0
    # above the bound: most + 1, without converting the text (int() refuses 5,000 digits)
    assert whole_number("9" * 5000, 10**12) == 10**12 + 1
    assert whole_number("1000000000001", 10**12) == 10**12 + 1
    assert whole_number("99", 16) == 99  # as many digits as the bound: converted
    for text in ("", "_1", "1_", "1__0", "+1", "-1", "1.0", "\u0663", "\uff11", " 1"):
        assert whole_number(text, 10) is None, text


def test_quote_is_short_printable_ascii() -> None:
    assert quote("40000") == "40000"
    assert quote("a\tb\x1b[0m\u00e9") == "a\\x09b\\x1b[0m\\xc3\\xa9"
    assert quote("\udcff") == "\\xff"  # a non-UTF-8 byte of argv (surrogateescape)
    assert quote("x" * 41) == "x" * 40 + "..."
    assert quote("x" * 40) == "x" * 40


def test_lua_block_carries_the_bounds() -> None:
    block = lua_catalog_block(ModelCatalog.default())
    for line in (f"  comment_bytes = {MAX_COMMENT_BYTES},", f"  value_bytes = {MAX_VALUE_BYTES},",
                 f"  steps = {MAX_STEPS},", f"  weight_min = {MIN_WEIGHT!r},",
                 f"  weight_max = {MAX_WEIGHT!r},", f"  gpus = {MAX_GPUS},",
                 f"  rungs = {MAX_RUNGS},", f"  eta_min = {MIN_ETA},", f"  eta_max = {MAX_ETA},"):
        assert line + "\n" in block, line


def lua_block_in_file() -> str:
    lines = (REPO / "slurm_conf" / "job_submit.lua").read_text().splitlines(keepends=True)
    begin = [i for i, line in enumerate(lines) if line.rstrip("\n") == LUA_BEGIN]
    end = [i for i, line in enumerate(lines) if line.rstrip("\n") == LUA_END]
    assert len(begin) == 1 and len(end) == 1 and begin[0] < end[0], "markers missing"
    return "".join(lines[begin[0]:end[0] + 1])


def test_lua_catalog_block_is_the_generated_one() -> None:
    # If this fails after a change of the throughput table: `hadar-slurm hints lua` and paste
    # its output over the block in slurm_conf/job_submit.lua.
    assert lua_block_in_file() == lua_catalog_block(ModelCatalog.default())


def test_lua_catalog_block_escapes_strings() -> None:
    table = ThroughputTable({('Odd "Net"\\ é (batch size 4)', 2): {"v100": 1.0}}, "t")
    block = lua_catalog_block(ModelCatalog.from_table(table))
    assert '[4] = {job_type = "Odd \\"Net\\"\\\\ \\195\\169 (batch size 4)", gpus = {2}},' in block
    assert block.startswith(LUA_BEGIN + "\n") and block.endswith(LUA_END + "\n")


def run_hints_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    parser = argparse.ArgumentParser(prog="hadar-slurm")
    cli_hints.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_cli_check_and_lua(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_hints_cli(capsys, "hints", "check", "hadar: model=ResNet-50 bs=64 steps=40_000",
                        "--gpus", "2")
    assert out == ("hadar: model=resnet50 bs=64 steps=40000 sync=true weight=1  "
                   "job_type='ResNet-50 (batch size 64)'\n")
    out = run_hints_cli(capsys, "hints", "check", "hadar: model=a3c steps=9 sync=no", "--json")
    assert json.loads(out) == {"model": "a3c", "batch_size": None, "steps": 9, "sync": False,
                               "weight": 1.0, "job_type": "A3C", "fork": 1,
                               "preempt": "never", "share": True, "study": None}
    out = run_hints_cli(capsys, "hints", "check", "hadar: model=a3c steps=9 share=No", "--json")
    assert json.loads(out)["share"] is False
    out = run_hints_cli(capsys, "hints", "check", "hadar: model=a3c steps=9 share=No")
    assert out == "hadar: model=a3c steps=9 sync=true weight=1 share=false  job_type='A3C'\n"
    assert run_hints_cli(capsys, "hints", "lua") == lua_catalog_block(ModelCatalog.default())
    with pytest.raises(HintError, match="a3c runs on 1 GPU"):
        run_hints_cli(capsys, "hints", "check", "hadar: model=a3c steps=9", "--gpus", "2")
