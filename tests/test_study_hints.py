"""The study hints of a ``hadar:`` comment (issue #17): study, rule, rungs, eta, metric, mode,
in hadar_slurm/hints.py's parse_hints.  (job_submit.lua's twin is checked against it on the dev
cluster in tests/test_submit_lua.py and tests/test_hint_bounds.py.)"""

from __future__ import annotations

import re

import pytest

import hadar_slurm.hints as hints_module
from hadar_slurm.errors import InputError
from hadar_slurm.hints import (
    HINT_KEYS,
    MAX_COMMENT_BYTES,
    MAX_ETA,
    MAX_RUNGS,
    MAX_VALUE_BYTES,
    MIN_ETA,
    STUDY_MODES,
    STUDY_RULES,
    HintError,
    Hints,
    StudyHints,
    parse_hints,
)
from hadar_slurm.studies.spec import _NAME as SPEC_NAME
from hadar_slurm.studies.spec import Rule, StudySpec

BASE = "hadar: model=resnet18 bs=64 steps=40000"
ISSUE = ("hadar: model=resnet18 bs=64 steps=40000 study=lr-search rule=sh rungs=4 eta=3 "
         "metric=accuracy mode=max")
NAME_MSG = ("{} must be letters, digits, '_', '.' or '-', starting with a letter or digit, "
            "got '{}' ({})")
STUDY_FIX = "e.g. study=lr-search"
METRIC_FIX = "e.g. metric=accuracy, what the trials report"
RULE_MSG = ("rule must be asha, sh, hyperband or none, got '{}' (asha: asynchronous successive "
            "halving; sh: synchronous successive halving; hyperband: brackets of sh that start "
            "at each rung; none: every trial trains to the end)")
RUNGS_MSG = "rungs must be a whole number from 1 to 10, got '{}' (e.g. rungs=4, three halvings)"
ETA_MSG = ("eta must be a whole number from 2 to 16, got '{}' (e.g. eta=3: the best third of "
           "the trials go on at each rung)")
MODE_MSG = ("mode must be max or min, got '{}' (max: higher is better, e.g. accuracy; min: "
            "lower is better, e.g. loss)")
RUNG_MSG = ("the first rung would train less than one step: steps={} < eta^(rungs-1) = {}^{} = "
            "{} (fewer rungs, a smaller eta or more steps)")
ARRAY_MSG = "a study is a job array (submit with --array=0-N, one task per trial)"


def refused(comment: str, *, gpus: int | None = None, array: bool | None = None) -> HintError:
    with pytest.raises(HintError) as exc:
        parse_hints(comment, gpus=gpus, array=array)
    message = str(exc.value)
    assert isinstance(exc.value, InputError)
    assert message.isascii() and message.isprintable() and len(message) < 300, message
    return exc.value


# -- good studies -----------------------------------------------------------------------------

def test_the_issue_example() -> None:
    hints = parse_hints(ISSUE, gpus=1, array=True)
    assert hints.study == StudyHints("lr-search", "sh", 4, 3, "accuracy", "max")
    assert (hints.model, hints.batch_size, hints.steps) == ("resnet18", 64, 40000)
    assert hints.job_type == "ResNet-18 (batch size 64)"


@pytest.mark.parametrize("array", [True, None])
def test_defaults(array: bool | None) -> None:
    hints = parse_hints(f"{BASE} study=s1", array=array)
    assert hints.study == StudyHints("s1")
    study = hints.study
    assert study is not None
    assert (study.rule, study.rungs, study.eta, study.metric, study.mode) == (
        "asha", 4, 3, "accuracy", "max")
    assert (STUDY_RULES, STUDY_MODES) == (("asha", "sh", "hyperband", "none"), ("max", "min"))


@pytest.mark.parametrize("comment, study", [
    (f"{BASE} study=a", StudyHints("a")),
    (f"{BASE} study=A.b_c-9 rule=none", StudyHints("A.b_c-9", rule="none")),
    (f"{BASE} study=hb rule=hyperband", StudyHints("hb", rule="hyperband")),
    (f"{BASE} study=9lives rule=asha mode=min metric=val_loss",
     StudyHints("9lives", metric="val_loss", mode="min")),
    (f"{BASE} study=x rungs=1 eta=2", StudyHints("x", rungs=1, eta=2)),
    (f"{BASE} study=x rungs=0_5 eta=0_4", StudyHints("x", rungs=5, eta=4)),  # as fork: 01, 1_6
    (f"{BASE} study=x rungs=010 eta=2", StudyHints("x", rungs=10, eta=2)),
    (f"{BASE} study=x rungs=3 eta=16", StudyHints("x", rungs=3, eta=16)),
    (f"{BASE} metric=top-1.acc study=s", StudyHints("s", metric="top-1.acc")),
    (f"{BASE} study={'s' * MAX_VALUE_BYTES}", StudyHints("s" * MAX_VALUE_BYTES)),
    (f"{BASE} study=s metric={'m' * MAX_VALUE_BYTES}",
     StudyHints("s", metric="m" * MAX_VALUE_BYTES)),
])
def test_good_studies(comment: str, study: StudyHints) -> None:
    hints = parse_hints(comment, array=True)
    assert hints.study == study
    # the canonical comment writes every study hint and reads back
    text = hints.to_comment()
    assert text.endswith(" " + study.to_comment())
    assert parse_hints(text, array=True) == hints


def test_fork_is_allowed_on_a_study() -> None:
    hints = parse_hints("hadar: model=lm bs=5 steps=10000 fork=2 study=s", gpus=2, array=True)
    assert hints.fork == 2 and hints.preempt_mode == "checkpoint"
    assert hints.study == StudyHints("s")


def test_an_ordinary_job_has_no_study_and_its_comment_is_unchanged() -> None:
    hints = parse_hints(BASE, array=False)  # an array or not: not checked for a plain job
    assert hints.study is None and parse_hints(BASE, array=True) == hints
    assert hints.to_comment() == f"{BASE} sync=true weight=1"
    assert Hints("a3c", None, 1, True, 1.0, "A3C").study is None


# -- bad values -------------------------------------------------------------------------------

# (comment after BASE, field, exact message)
BAD = [
    # study names
    ("study=-x", "study", NAME_MSG.format("study", "-x", STUDY_FIX)),
    ("study=_x", "study", NAME_MSG.format("study", "_x", STUDY_FIX)),
    ("study=.x", "study", NAME_MSG.format("study", ".x", STUDY_FIX)),
    ("study=lr/search", "study", NAME_MSG.format("study", "lr/search", STUDY_FIX)),
    ("study=lr+search", "study", NAME_MSG.format("study", "lr+search", STUDY_FIX)),
    ("study=lr,x", "study", NAME_MSG.format("study", "lr,x", STUDY_FIX)),
    ("study=caf\u00e9", "study", NAME_MSG.format("study", "caf\\xc3\\xa9", STUDY_FIX)),
    ("study=\uff53", "study", NAME_MSG.format("study", "\\xef\\xbd\\x93", STUDY_FIX)),
    ("study=a\x1b[31m", "study", NAME_MSG.format("study", "a\\x1b[31m", STUDY_FIX)),
    ("study=" + "s" * 65, "study",
     "hint 'study' has a value longer than 64 bytes (write study=NAME)"),
    ("study=", "study", "hint 'study' has no value (write study=NAME)"),
    ("study=a study=b", "study", "hint 'study' given twice (give it once)"),
    ("Study=a", "hints", "unknown hint 'Study' (keys: " + ", ".join(HINT_KEYS) + ")"),
    # rules: lower case only, as preempt
    ("study=s rule=ASHA", "rule", RULE_MSG.format("ASHA")),
    ("study=s rule=Sh", "rule", RULE_MSG.format("Sh")),
    ("study=s rule=HyperBand", "rule", RULE_MSG.format("HyperBand")),
    ("study=s rule=asha\x00", "rule", RULE_MSG.format("asha\\x00")),
    ("study=s rule=", "rule", "hint 'rule' has no value (write rule=asha)"),
    # rungs: 1 to 10
    ("study=s rungs=0", "rungs", RUNGS_MSG.format("0")),
    ("study=s rungs=11", "rungs", RUNGS_MSG.format("11")),
    ("study=s rungs=-1", "rungs", RUNGS_MSG.format("-1")),
    ("study=s rungs=4.0", "rungs", RUNGS_MSG.format("4.0")),
    ("study=s rungs=1e1", "rungs", RUNGS_MSG.format("1e1")),
    ("study=s rungs=\u0664", "rungs", RUNGS_MSG.format("\\xd9\\xa4")),
    ("study=s rungs=" + "9" * 50, "rungs", RUNGS_MSG.format("9" * 40 + "...")),
    ("study=s rungs=4_", "rungs", RUNGS_MSG.format("4_")),
    ("study=s rungs=", "rungs", "hint 'rungs' has no value (write rungs=N)"),
    # eta: 2 to 16
    ("study=s eta=1", "eta", ETA_MSG.format("1")),
    ("study=s eta=0", "eta", ETA_MSG.format("0")),
    ("study=s eta=17", "eta", ETA_MSG.format("17")),
    ("study=s eta=2.5", "eta", ETA_MSG.format("2.5")),
    ("study=s eta=e", "eta", ETA_MSG.format("e")),
    ("study=s eta=" + "1" * 64, "eta", ETA_MSG.format("1" * 40 + "...")),
    ("study=s eta=" + "1" * 65, "eta", "hint 'eta' has a value longer than 64 bytes (write eta=N)"),
    # metric names
    ("study=s metric=-loss", "metric", NAME_MSG.format("metric", "-loss", METRIC_FIX)),
    ("study=s metric=val/loss", "metric", NAME_MSG.format("metric", "val/loss", METRIC_FIX)),
    ("study=s metric=", "metric", "hint 'metric' has no value (write metric=NAME)"),
    # modes: lower case only
    ("study=s mode=MAX", "mode", MODE_MSG.format("MAX")),
    ("study=s mode=maximize", "mode", MODE_MSG.format("maximize")),
    ("study=s mode=true", "mode", MODE_MSG.format("true")),
    ("study=s mode=", "mode", "hint 'mode' has no value (write mode=max)"),
]


@pytest.mark.parametrize("tail, field, message", BAD, ids=[f"{i:02d}" for i in range(len(BAD))])
def test_bad_study_hints(tail: str, field: str, message: str) -> None:
    exc = refused(f"{BASE} {tail}", array=True)
    assert (exc.field, str(exc)) == (field, message)


@pytest.mark.parametrize("key, value", [
    ("rule", "sh"), ("rungs", "4"), ("eta", "3"), ("metric", "loss"), ("mode", "min"),
    ("rule", "bogus"), ("rungs", "99"),  # the missing study is the problem, not the value
])
def test_study_keys_without_study(key: str, value: str) -> None:
    for array in (True, False, None):
        exc = refused(f"{BASE} {key}={value}", array=array)
        assert exc.field == key
        assert str(exc) == (f"hint '{key}' is only for a study (add study=NAME, or remove "
                            f"{key}={value})")


def test_study_keys_without_study_quote_their_value() -> None:
    exc = refused(f"{BASE} metric=a\x1b" + "b" * 50)
    assert str(exc) == ("hint 'metric' is only for a study (add study=NAME, or remove "
                        "metric=a\\x1b" + "b" * 38 + "...)")


def test_the_first_study_key_in_key_order_is_reported() -> None:
    # token order does not matter for values: rule before rungs before ... mode
    assert refused(f"{BASE} mode=min eta=2 rule=sh").field == "rule"
    assert refused(f"{BASE} mode=min metric=x").field == "metric"


# -- the first rung ---------------------------------------------------------------------------

@pytest.mark.parametrize("steps, rungs, eta, ok", [
    # eta^(rungs-1): the steps of the last rung over those of the first
    (27, 4, 3, True),  # 27 // 3^3 = 1 step in the first rung
    (26, 4, 3, False),  # 26 // 27 = 0
    (40000, 4, 3, True),  # the issue's study: 40000 // 27 = 1481 steps in the first rung
    (40000, 10, 3, True),  # 3^9 = 19683: 2 steps
    (40000, 10, 4, False),  # 4^9 = 262144 > 40000
    (262144, 10, 4, True),
    (1, 1, 16, True),  # one rung: every trial trains to the end
    (1, 2, 2, False),
    (2, 2, 2, True),
    (2**36, 10, 16, True),  # the largest eta^(rungs-1): 16^9 = 2^36
    (2**36 - 1, 10, 16, False),
    (10**12, 10, 16, True),
])
def test_the_first_rung_trains_a_step(steps: int, rungs: int, eta: int, ok: bool) -> None:
    comment = f"hadar: model=a3c steps={steps} study=s rungs={rungs} eta={eta}"
    # the same decision as StudySpec's (hadar_slurm/studies/spec.py)
    try:
        StudySpec("s", "A3C", 1, float(steps), rungs=rungs, eta=float(eta))
        spec_ok = True
    except InputError as spec_error:
        assert spec_error.field == "rungs"
        spec_ok = False
    assert spec_ok == ok
    if ok:
        study = parse_hints(comment, array=True).study
        assert study is not None and steps // study.eta ** (study.rungs - 1) >= 1
    else:
        exc = refused(comment, array=True)
        assert exc.field == "rungs"
        assert str(exc) == RUNG_MSG.format(steps, eta, rungs - 1, eta ** (rungs - 1))


def test_the_first_rung_with_the_defaults() -> None:
    exc = refused("hadar: model=a3c steps=26 study=s", array=True)
    assert str(exc) == RUNG_MSG.format(26, 3, 3, 27)
    assert parse_hints("hadar: model=a3c steps=27 study=s").study == StudyHints("s")


# -- the job array ----------------------------------------------------------------------------

def test_a_study_must_be_a_job_array() -> None:
    exc = refused(ISSUE, gpus=1, array=False)
    assert (exc.field, str(exc)) == ("array", ARRAY_MSG)
    assert parse_hints(ISSUE, gpus=1, array=True).study is not None
    assert parse_hints(ISSUE, gpus=1).study is not None  # array unknown (the sidecar): not checked


def test_order_of_study_problems() -> None:
    # after the job's own hints (share last of them), before the GPU count; within a study:
    # study, rule, rungs, eta, metric, mode, the first rung, the job array
    assert refused(f"{BASE} share=x rule=x", array=False).field == "share"
    assert refused(f"{BASE} rule=x study=-", gpus=3, array=False).field == "study"
    assert refused(f"{BASE} mode=x eta=x rungs=x rule=x study=s", array=False).field == "rule"
    assert refused(f"{BASE} mode=x eta=x rungs=x study=s", array=False).field == "rungs"
    assert refused(f"{BASE} mode=x metric=- eta=x study=s", array=False).field == "eta"
    assert refused(f"{BASE} mode=x metric=- study=s", array=False).field == "metric"
    assert refused(f"{BASE} mode=x study=s", array=False).field == "mode"
    assert refused("hadar: model=a3c steps=2 study=s", gpus=3, array=False).field == "rungs"
    assert refused("hadar: model=a3c steps=27 study=s", gpus=3, array=False).field == "array"
    assert refused("hadar: model=a3c steps=27 study=s", gpus=3, array=True).field == "gpus"


# -- the rules are the ones of the rest of hadar ----------------------------------------------

@pytest.mark.parametrize("name", [
    "a", "Z", "0", "lr-search", "a.b_c-d", "x" * 64, "-a", "_a", ".a", "", "a b", "a/b", "a:b",
    "caf\u00e9", "\u0661", "x" * 65,
])
def test_names_follow_the_study_specs_rule(name: str) -> None:
    # (a hint's value is at most MAX_VALUE_BYTES long, and has no whitespace)
    ours = bool(hints_module._NAME.fullmatch(name)) and len(name.encode()) <= MAX_VALUE_BYTES
    assert ours == bool(SPEC_NAME.match(name))


def test_rules_and_bounds_are_the_study_specs() -> None:
    assert tuple(r.value for r in Rule) == STUDY_RULES
    assert (MAX_RUNGS, MIN_ETA, MAX_ETA) == (10, 2, 16)
    StudySpec("s", "A3C", 1, 16.0**9, rungs=MAX_RUNGS, eta=float(MAX_ETA))  # the extremes
    with pytest.raises(InputError, match="rungs must be 1 to 10"):
        StudySpec("s", "A3C", 1, 1e12, rungs=MAX_RUNGS + 1)


# -- bounds -----------------------------------------------------------------------------------

LONGEST = ("hadar: model=recommendation bs=8192 steps=1000000000000 sync=false weight=1000 "
           "fork=16 preempt=checkpoint share=false study=" + "s" * 64 + " rule=asha rungs=10 "
           "eta=16 metric=" + "m" * 64 + " mode=max")


def test_a_comment_with_every_key_fits_the_bound() -> None:
    keys = re.findall(r"(\w+)=", LONGEST)
    assert tuple(keys) == HINT_KEYS
    hints = parse_hints(LONGEST, array=True)
    assert hints.study == StudyHints("s" * 64, "asha", 10, 16, "m" * 64, "max")
    assert len(LONGEST.encode()) == 295 < MAX_COMMENT_BYTES == 512
    usual = ("hadar: model=resnet50 bs=64 steps=40000 sync=true weight=1 fork=3 "
             "preempt=checkpoint share=true study=lr-search rule=asha rungs=4 eta=3 "
             "metric=accuracy mode=max")
    assert len(usual) == 160 and parse_hints(usual, array=True).fork == 3
    # the module docstring's count of tokens
    doc = hints_module.__doc__ or ""
    assert f"at most ``len(HINT_KEYS)`` ({len(HINT_KEYS)}) tokens" in doc


def test_more_tokens_than_keys_are_refused() -> None:
    exc = refused(LONGEST + " study=t", array=True)
    assert (exc.field, str(exc)) == ("study", "hint 'study' given twice (give it once)")
