"""The command line: doctor, and the fork benchmark's output shape (a tiny run; numbers come from the real bench)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def bunshin(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bunshin.engine.cli", *args], capture_output=True, text=True,
                          timeout=600, **kw)


def test_doctor_reports_checks_and_backends(docker_daemon: str) -> None:
    proc = bunshin("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    names = {c["name"] for c in report["checks"]}
    assert {"root", "namespace mount", "overlayfs", "btrfs", "cgroups", "KSM", "docker daemon",
            "bunshin kernel module", "chromium", "browser fork: replay", "fast cgroup moves"} <= names
    moves = next(c for c in report["checks"] if c["name"] == "fast cgroup moves")
    assert moves["ok"] and "favordynmods" in moves["detail"]  # Linux 6.18 here
    replay = next(c for c in report["checks"] if c["name"] == "browser fork: replay")
    assert replay["ok"] and "started fresh and brought to its source's state" in replay["detail"]
    assert report["backends"]["cow"]["available"] is True
    from bunshin.envs.runtime.fork.registry import BACKENDS

    docker = "docker (--runtime docker)"  # the backends that exist, nothing "not built yet"; Docker's is no live fork
    assert list(report["backends"]) == [*BACKENDS, docker]
    assert report["backends"][docker]["available"] is True
    assert "its fork is not live" in report["backends"][docker]["detail"]
    assert "not built yet" not in proc.stdout
    # which image each suite's workspaces stand on, and whether it is built here
    assert {"suite": "webshop", "knobs": {"browser": "chromium"}, "images": ["chromium"]} in report["suites"]
    assert {"suite": "desktop", "knobs": {}, "images": ["base"]} in report["suites"]
    assert report["images"]["base"]["built"] is True  # scripts/setup.sh built it


def test_bench_fork_writes_the_promised_json(tmp_path: Path) -> None:
    out, plot = tmp_path / "fork.json", tmp_path / "fork.png"
    proc = bunshin("bench", "fork", "--sizes", "8M", "--backends", "cow,restore", "--forks", "2",
                   "--json", str(out), "--plot", str(plot))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert [r["backend"] for r in data["results"]] == ["cow", "restore"]
    for row in data["results"]:
        assert {"backend", "size_bytes", "freeze_ms_p50", "freeze_ms_p95", "ready_ms_p50", "ready_ms_p95",
                "again_ms_p50", "clone_private_bytes", "clone_page_tables_bytes"} <= set(row)
        assert row["clone_page_tables_bytes"] > 0
        assert row["size_bytes"] == 8 << 20
        assert row["freeze_ms_p95"] >= row["freeze_ms_p50"] > 0
    assert data["ratios_cow_vs_restore"][0]["size_bytes"] == 8 << 20
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| backend |" in proc.stdout and "round 2/2" in proc.stderr
    restore = data["results"][1]["samples"]
    assert restore["again_ms"] and all(f > 0 for f in restore["freeze_ms"])  # every round dumps a new state
    # where the live clone's setup went, step by step, in the clone's order (the restore backend starts a host)
    cow = data["results"][0]
    steps = ["cgroup", "namespaces", "root", "forget", "loopback", "reopen", "after_fork"]
    if cow["shell_forks"] == cow["forks"]:  # every clone in a prepared shell, whose loopback was up already
        steps.remove("loopback")
    assert [s for s in cow["clone_steps_ms_p50"] if s != "loopback"] == [s for s in steps if s != "loopback"]
    assert ("loopback" in cow["clone_steps_ms_p50"]) == ("loopback" in steps)
    assert all(v >= 0 for v in cow["clone_steps_ms_p50"].values()) and restore.get("clone_steps_ms") == {}
    assert sum(cow["clone_steps_ms_p50"].values()) < cow["ready_ms_p95"] * 2
    assert "clone setup, p50 ms" in proc.stdout


def test_bench_fork_in_4k_pages_and_against_sandlock(tmp_path: Path) -> None:
    """``--pages huge,4k --peer sandlock``: the workspace's heap in the pages asked for (none of it in huge pages
    with 4k), Sandlock's process fork of the same heap measured in the same run, and the ratios cow/sandlock."""
    out, plot = tmp_path / "fork.json", tmp_path / "fork.png"
    size = 32 << 20
    proc = bunshin("bench", "fork", "--sizes", "32M", "--backends", "cow", "--forks", "2", "--pages", "huge,4k",
                   "--peer", "sandlock", "--json", str(out), "--plot", str(plot))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    rows = {(r["backend"], r["pages"]): r for r in data["results"]}
    assert sorted(rows) == [("cow", "4k"), ("cow", "huge"), ("sandlock", "4k"), ("sandlock", "huge")]
    for backend in ("cow", "sandlock"):
        assert rows[backend, "4k"]["source_huge_bytes"] == 0
        assert rows[backend, "huge"]["source_huge_bytes"] >= size // 2  # THP in madvise mode here
    for row in rows.values():
        assert row["ready_ms_p50"] > 0 and row["clone_private_bytes"] > 0 and row["size_bytes"] == size
        assert row["clone_private_bytes"] < size // 4  # a copy-on-write fork, on both sides
    assert "freeze_ms_p50" not in rows["sandlock", "huge"]  # the peer does not stop its source: nothing measured
    ratios = {r["pages"]: r for r in data["ratios_cow_vs_sandlock"]}
    assert set(ratios) == {"huge", "4k"}
    for page, r in ratios.items():
        assert r["ready_p50_ratio"] == rows["cow", page]["ready_ms_p50"] / rows["sandlock", page]["ready_ms_p50"]
    assert "ready cow/sandlock" in proc.stdout and "[sandlock 32 MiB 4k] round 2/2" in proc.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(rows["cow", page]["one_step_forks"] == 2 for page in ("huge", "4k"))
    bad = bunshin("bench", "fork", "--pages", "2m")
    assert bad.returncode == 2 and "bad page list '2m'" in bad.stderr


def test_bench_fork_two_step_compares_one_step_clones_with_the_double_fork(tmp_path: Path) -> None:
    out = tmp_path / "fork.json"
    proc = bunshin("bench", "fork", "--sizes", "32M", "--backends", "cow", "--forks", "2", "--pages", "4k",
                   "--two-step", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    rows = {r["backend"]: r for r in data["results"]}
    assert rows["cow"]["one_step_forks"] == 2 and rows["cow-2step"]["one_step_forks"] == 0
    for row in rows.values():  # a thrown-away branch's CPU, by party, every part measured
        parts = row["branch_cpu_ms_p50_by_part"]
        assert set(parts) == {"source", "clone", "nursery", "engine", "total"} and row["branch_cpu_ms_p50"] > 0
        assert parts["source"] > 0 and parts["clone"] > 0 and parts["engine"] > 0
    assert "thrown-away branch CPU, p50 ms" in proc.stdout
    (ratio,) = data["ratios_cow_vs_two_step"]
    assert ratio["freeze_p50_ratio"] == rows["cow"]["freeze_ms_p50"] / rows["cow-2step"]["freeze_ms_p50"]
    assert "freeze cow/cow-2step" in proc.stdout


def test_bench_fork_no_shells_compares_prepared_shells_with_forks_that_make_their_own(tmp_path: Path) -> None:
    out = tmp_path / "fork.json"
    proc = bunshin("bench", "fork", "--sizes", "32M", "--backends", "cow", "--forks", "2", "--no-shells",
                   "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    rows = {r["backend"]: r for r in data["results"]}
    assert rows["cow"]["shell_forks"] >= 1 and rows["cow"]["shells"]["hits"] >= 1  # the run's first forks hit
    assert rows["cow-noshell"]["shell_forks"] == 0 and rows["cow-noshell"]["shells"]["started"] == 0
    assert "loopback" in rows["cow-noshell"]["clone_steps_ms_p50"]  # made on the fork's path without a shell
    (ratio,) = data["ratios_cow_vs_no_shells"]
    assert ratio["ready_p50_ratio"] == rows["cow"]["ready_ms_p50"] / rows["cow-noshell"]["ready_ms_p50"]
    assert "ready cow/cow-noshell" in proc.stdout


def test_bench_memory_repeats_and_summarises(tmp_path: Path) -> None:
    """Two repeats of a tiny batch on both backends: every run's figures (peak, mean, wall, GiB*s, the PSS sum,
    page tables, engine and nursery), their medians and ranges, and the ratios within a repeat."""
    out, plot = tmp_path / "memory.json", tmp_path / "memory.png"
    proc = bunshin("bench", "memory", "--suite", "desktop", "--rollouts", "2", "--group-size", "2", "--repeat", "2",
                   "--time-scale", "0", "--json", str(out), "--plot", str(plot))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert [(r["repeat"], r["backend"]) for r in data["results"]] == [
        (0, "cow"), (0, "restore"), (1, "cow"), (1, "restore")]
    for r in data["results"]:
        assert r["ok"] == r["rollouts"] == 2
        assert 0 < r["mean_bytes"] <= r["peak_bytes"]
        assert r["pss_peak"] > 0 and r["page_tables_peak"] > 0 and r["engine_peak"] > 0 and r["nursery_peak"] > 0
        assert r["total_gib_s"] > 0 and r["wall_s"] > 0
    for run in data["summary"]["runs"]:
        assert run["peak_bytes"]["n"] == 2
        assert run["peak_bytes"]["min"] <= run["peak_bytes"]["median"] <= run["peak_bytes"]["max"]
    assert [r["repeat"] for r in data["ratios"]] == [0, 1]
    assert data["summary"]["ratios"][0]["peak_ratio"]["n"] == 2
    assert [(r["config"], r["ksm"]) for r in data["results"][:2]] == [("cow", False), ("restore", False)]
    assert data["ratios"][0]["config"] == "cow"  # every configuration against the private restore
    assert "mean memory / restore" in proc.stdout and "[2/4]" in proc.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments_name_the_culprit() -> None:
    proc = bunshin("bench", "fork", "--backends", "cow,criu")
    assert proc.returncode == 2 and "unknown backend(s) ['criu']" in proc.stderr
    proc = bunshin("bench", "fork", "--sizes", "lots")
    assert proc.returncode == 2 and "bad size list 'lots'" in proc.stderr


def test_demo_runs_and_checks_isolation() -> None:
    proc = bunshin("demo", "--size", "16M", "--clones", "2")
    assert proc.returncode == 0, proc.stderr
    assert "isolation check: passed" in proc.stdout


def test_eval_then_replay_from_the_command_line(tmp_path: Path) -> None:
    """``bunshin eval`` writes trajectories and the promised summary; ``bunshin replay`` reproduces them. The
    engine runs in its own process here, with its state in the test state directory."""
    import os

    from .conftest import host_processes

    env = {**os.environ, "BUNSHIN_STATE_DIR": "/var/lib/bunshin-test"}
    out = tmp_path / "run"
    proc = bunshin("eval", "--suite", "webshop", "--catalog-size", "2000", "--limit", "2", "--group-size", "2",
                   "--concurrency", "4", "--time-scale", "0", "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert {"rollouts", "succeeded", "failed", "mean_reward", "wall_s", "peak_memory_bytes", "total_memory_gib_s",
            "backend"} <= set(summary)
    assert summary["rollouts"] == 4 and summary["backend"] == "cow" and summary["peak_memory_bytes"] > 0
    assert "| tasks | rollouts |" in proc.stdout and "4/4 rollouts" in proc.stderr  # table and progress
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 4
    report_path = tmp_path / "replay.json"
    assert summary["knobs"]["catalog_size"] == 2000 and summary["knobs"]["time_scale"] == 0
    # the replay builds the suite as recorded (summary.json's knobs), told nothing
    proc = bunshin("replay", str(out / "trajectories.jsonl"), "--json", str(report_path), env=env)
    assert proc.returncode == 0, proc.stderr
    assert "replaying with the knobs recorded beside it: " in proc.stderr and "catalog_size=2000" in proc.stderr
    report = json.loads(report_path.read_text())
    assert report["trajectories"] == report["identical_observations"] == report["identical_rewards"] == 4
    assert host_processes() == []  # the engine process took its workspaces with it


def test_eval_refuses_a_bad_policy_spec() -> None:
    proc = bunshin("eval", "--suite", "webshop", "--policy", "magic", "--out", "/tmp/never")
    assert proc.returncode != 0 and "unknown policy 'magic'" in proc.stderr


def parse(*argv: str):
    from bunshin.engine.cli import build_parser

    return build_parser().parse_args(list(argv))


EVAL = ("eval", "--suite", "webshop", "--out", "/tmp/never")


def test_speculation_flags_build_spec_settings(tmp_path: Path) -> None:
    from bunshin.engine.commands.flags import spec_settings
    from bunshin.engine.speculation.settings import SpecSettings

    assert spec_settings(parse(*EVAL)) is None
    assert spec_settings(parse(*EVAL, "--speculate")) == SpecSettings()
    train = tmp_path / "trajectories.jsonl"
    train.write_text("")
    assert spec_settings(parse(*EVAL, "--speculate", "--spec-slots", "2", "--spec-threshold", "0.3",
                               "--spec-memory", "64M", "--spec-train", str(train), "--spec-readonly")) == SpecSettings(
        slots=2, threshold=0.3, memory_budget=64 << 20, memory_headroom=None, train_file=train, read_only=True)
    unbounded = spec_settings(parse(*EVAL, "--speculate", "--spec-memory", "none"))
    assert unbounded.memory_budget is None and unbounded.memory_headroom is None
    relative = spec_settings(parse(*EVAL, "--speculate", "--spec-memory", "25%"))
    assert relative.memory_budget is None and relative.memory_headroom == 0.25
    assert spec_settings(parse(*EVAL, "--speculate", "--spec-cpu-limit", "0.9")) == SpecSettings(cpu_limit=0.9)
    # the selector is saved with the prefix cache's directory
    assert spec_settings(parse(*EVAL, "--speculate", "--prefix-cache", "--cache-dir", str(tmp_path))) == SpecSettings(
        model_dir=tmp_path)
    assert spec_settings(parse(*EVAL, "--speculate", "--cache-dir", str(tmp_path))).model_dir is None
    # bench epoch: the speculating modes' settings, by default all five modes, the policy's own detour rate
    args = parse("bench", "epoch", "--suite", "webshop", "--spec-slots", "3", "--detour-p", "0.3")
    assert args.modes == ["base", "spec", "spec-readonly", "prefix", "full"] and args.detour_p == 0.3
    assert spec_settings(args, "bunshin bench epoch") == SpecSettings(slots=3)
    assert parse("bench", "epoch", "--suite", "webshop").detour_p is None


def test_bad_speculation_flags_are_refused_as_argparse_errors(tmp_path: Path, capsys) -> None:
    """``spec_settings`` refuses a flag with an ``ArgumentRefused`` naming it; ``main`` alone turns that into
    argparse's error (the command's usage, ``<command>: error: <reason>``, status 2)."""
    import pytest

    from bunshin.engine import cli
    from bunshin.engine.commands.flags import spec_settings
    from bunshin.engine.errors import ArgumentRefused

    for argv, command, message in [
        ((*EVAL, "--spec-slots", "2"), "bunshin eval", "--spec-slots needs --speculate"),
        ((*EVAL, "--spec-threshold", "0.2", "--spec-readonly"), "bunshin eval",
         "--spec-threshold, --spec-readonly need --speculate"),
        ((*EVAL, "--speculate", "--spec-threshold", "1.5"), "bunshin eval", "must be a probability in [0, 1]"),
        ((*EVAL, "--speculate", "--spec-slots", "0"), "bunshin eval", "slots must be >= 1"),
        ((*EVAL, "--speculate", "--spec-memory", "2000%"), "bunshin eval", "headroom must be a fraction"),
        ((*EVAL, "--speculate", "--spec-cpu-limit", "1.2"), "bunshin eval", "CPU limit must be a fraction in (0, 1]"),
        ((*EVAL, "--spec-cpu-limit", "0.9"), "bunshin eval", "--spec-cpu-limit needs --speculate"),
        ((*EVAL, "--speculate", "--spec-train", str(tmp_path / "missing.jsonl")), "bunshin eval", "no such file"),
        (("bench", "epoch", "--suite", "webshop", "--modes", "base,prefix", "--spec-slots", "2"),
         "bunshin bench epoch", "need a speculating mode"),
    ]:
        with pytest.raises(ArgumentRefused) as refused:
            spec_settings(parse(*argv), command)
        assert refused.value.command == command and message in refused.value.reason, (argv, refused.value)
        assert str(refused.value) == f"{command}: {refused.value.reason}"
    for argv, message in [((*EVAL, "--spec-slots", "2"), "bunshin eval: error: --spec-slots needs --speculate"),
                          ((*EVAL, "--hot-budget", "1G"), "bunshin eval: --hot-budget need --prefix-cache")]:
        with pytest.raises(SystemExit) as exc:
            cli.main(list(argv))
        err = capsys.readouterr().err
        if "error:" in message:  # an argparse error: usage, the message, status 2
            assert exc.value.code == 2 and "usage: bunshin eval" in err and message in err, (argv, err)
        else:  # any other refusal: its message, status 1 (as SystemExit(message) exits)
            assert exc.value.code == message, argv


def test_a_hot_budget_in_percent_is_a_share_of_the_runs_memory(capsys: pytest.CaptureFixture[str]) -> None:
    from bunshin.engine.commands.flags import prefix_settings

    share = prefix_settings(parse(*EVAL, "--prefix-cache", "--hot-budget", "10%"))
    assert share is not None and share.hot_share == pytest.approx(0.1) and share.hot_budget is None
    absolute = prefix_settings(parse(*EVAL, "--prefix-cache", "--hot-budget", "512M"))
    assert absolute is not None and absolute.hot_share is None and absolute.hot_budget == 512 << 20
    default = prefix_settings(parse(*EVAL, "--prefix-cache"))
    assert default is not None and default.hot_share is None and default.hot_budget == 256 << 20
    for bad, says in (("5000%", "a share must be within 0% and 1000%"), ("x%", "bad percentage")):
        with pytest.raises(SystemExit):
            parse(*EVAL, "--prefix-cache", "--hot-budget", bad)
        assert says in capsys.readouterr().err


def test_eval_summary_counts_steps_by_source_and_shows_speculation() -> None:
    from bunshin.engine.commands.eval_command import SPECULATION_COLUMNS, speculation_rows, steps_by_source
    from bunshin.engine.records import Status, Step, StepObservation, ToolCall, Trajectory

    def t(*sources: str) -> Trajectory:
        return Trajectory(task_id="t", suite="webshop", group_id="g", sample=0, seed=1, run_seed=1,
                          first_observation=StepObservation(output=""), status=Status.OK, reward=1.0,
                          steps=[Step(index=i, call=ToolCall(name="click", args={}), tool_s=0.1, reasoning_s=0.1,
                                      observation=StepObservation(output=""), source=s)
                                 for i, s in enumerate(sources)])

    steps = steps_by_source([t("executed", "speculated", "cached"), t("speculated", "rebuilt")])
    assert steps == {"executed": 1, "cached": 1, "rebuilt": 1, "speculated": 2}
    assert steps_by_source([]) == {"executed": 0, "cached": 0, "rebuilt": 0, "speculated": 0}
    summary = {"steps_by_source": steps, "speculation": {
        "spec_top1": 0.625, "spec_topk": None, "speculated": 5, "adopted": 3, "wasted": 2, "adopted_s": 1.5,
        "hidden_s": 1.0, "wasted_s": 0.75, "branch_bytes_peak": 3 << 20}}
    [row] = speculation_rows(summary)
    assert (row["top1"], row["topk"], row["branches"], row["steps_speculated"], row["peak"]) == (
        "62%", "-", "5 / 3 / 2", 2, "3.0 MiB")
    assert {k for k, _ in SPECULATION_COLUMNS} <= set(row)


def test_eval_speculates_and_summarises(tmp_path: Path) -> None:
    """``bunshin eval --speculate`` on a tiny batch: the summary has the engine's speculation statistics and the
    steps by source, the table shows them."""
    import os

    from bunshin.engine.speculation.settings import STATISTICS

    from .conftest import host_processes

    env = {**os.environ, "BUNSHIN_STATE_DIR": "/var/lib/bunshin-test"}
    out = tmp_path / "run"
    proc = bunshin("eval", "--suite", "webshop", "--catalog-size", "2000", "--limit", "2", "--group-size", "2",
                   "--concurrency", "4", "--time-scale", "0", "--policy", "grounded", "--out", str(out),
                   "--speculate", "--spec-slots", "2", "--spec-threshold", "0", env=env)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["speculation"]) == set(STATISTICS)
    steps = summary["steps_by_source"]
    assert set(steps) >= {"executed", "cached", "rebuilt", "speculated"} and steps["cached"] == 0
    assert sum(steps.values()) == sum(len(json.loads(line)["steps"])
                                      for line in (out / "trajectories.jsonl").read_text().splitlines())
    assert "| top-1 | top-k |" in proc.stdout and "| executed steps |" in proc.stdout
    assert host_processes() == []


def test_browser_flag_sets_the_suites_browser_knob_and_is_refused_without_a_browser(tmp_path: Path,
                                                                                   capsys) -> None:
    """``--browser`` on every command that takes a suite is the suite's ``browser`` knob (left out: the suite's own
    default, text); a suite without a browser (desktop) refuses it with a ``CommandError`` naming the flag, and so
    does a ``--set browser=`` that says otherwise."""
    import pytest

    from bunshin.engine import cli
    from bunshin.engine.commands.flags import make_suite
    from bunshin.engine.errors import CommandError

    suite_commands = [EVAL, ("suite", "check", "--suite", "webshop"), ("bench", "memory", "--suite", "webshop"),
                      ("bench", "sharing", "--suite", "webshop"), ("bench", "selector", "--suite", "webshop"),
                      ("bench", "scale", "--suite", "webshop"), ("bench", "epoch", "--suite", "webshop")]
    for argv in suite_commands:
        assert make_suite(parse(*argv)).knobs.get("browser", "text") == "text", argv  # the default
        suite = make_suite(parse(*argv, "--browser", "chromium"))
        assert suite.app().kwargs["browser"] == "chromium" and suite.knobs["browser"] == "chromium", argv
        assert make_suite(parse(*argv, "--browser", "text")).app().kwargs.get("browser", "text") == "text", argv
    replay = parse("replay", str(tmp_path / "t.jsonl"), "--browser", "chromium")
    replay.suite = "webshop"  # main takes it from the recording
    assert make_suite(replay).app().kwargs["browser"] == "chromium"
    with pytest.raises(SystemExit) as exc:
        parse(*EVAL, "--browser", "firefox")
    assert exc.value.code == 2 and "--browser: invalid choice: 'firefox'" in capsys.readouterr().err
    for argv in [("eval", "--suite", "desktop", "--out", "/tmp/never", "--browser", "chromium"),
                 ("suite", "check", "--suite", "desktop", "--browser", "text")]:
        with pytest.raises(CommandError, match=r"--browser \w+: suite desktop has no browser"):
            make_suite(parse(*argv))
    with pytest.raises(CommandError, match="--browser chromium and --set browser=text disagree"):
        make_suite(parse(*EVAL, "--browser", "chromium", "--set", "browser=text"))
    # through main: the refusal is the command's message and status, before any workspace starts
    with pytest.raises(SystemExit) as exc:
        cli.main(["suite", "check", "--suite", "desktop", "--browser", "chromium"])
    assert "--browser chromium: suite desktop has no browser" in str(exc.value.code)


def test_bench_fork_with_chromium_reports_hits_launches_and_restores(tmp_path) -> None:
    """``bench fork --browser chromium``: the pooled live fork takes a slot (a hit, no launch) and its clone's
    browser was restored; the figures and their samples are written."""
    out = tmp_path / "fork.json"
    proc = bunshin("bench", "fork", "--browser", "chromium", "--forks", "1", "--modes", "cow+pool,cow",
                   "--catalog-size", "200", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    pooled, own = json.loads(out.read_text())["results"]
    assert (pooled["mode"], pooled["forks"], pooled["hits"]) == ("cow+pool", 1, 1)
    assert (own["mode"], own["hits"]) == ("cow", 0)
    assert pooled["launch_ms_p50"] < 50 < own["launch_ms_p50"]  # taken over, not started / started
    assert pooled["restore_ms_p50"] > 0 and pooled["clone_pss_bytes"] > 100 << 20
    assert "| cow+pool |" in proc.stdout and "fork 1/1" in proc.stderr


def test_the_engine_sizes_the_pool_and_the_flag_reaches_it(monkeypatch) -> None:
    """``RolloutEngine``: two slots by default (fewer if fewer rollouts run at once), ``warm_pool=`` says
    otherwise; ``bunshin eval --warm-pool N`` is that argument."""
    from bunshin.engine import cli
    from bunshin.engine.commands import eval_command
    from bunshin.engine.rollout import RolloutEngine
    from bunshin.envs.webshop.suite import WebShopSuite
    from bunshin.policies.scripted import ScriptedPolicy

    suite = WebShopSuite(catalog_size=50, time_scale=0.0)
    assert RolloutEngine(suite, ScriptedPolicy(), concurrency=16).runtime.warm_pool == 2
    assert RolloutEngine(suite, ScriptedPolicy(), concurrency=1).runtime.warm_pool == 1
    assert RolloutEngine(suite, ScriptedPolicy(), concurrency=16, warm_pool=0).runtime.warm_pool == 0
    with pytest.raises(ValueError, match="warm_pool"):
        RolloutEngine(suite, ScriptedPolicy(), warm_pool=-1)
    seen = []

    async def fake(suite, policy, out, **kwargs):
        seen.append(kwargs["warm_pool"])
        return {"rollouts": 1}

    monkeypatch.setattr(eval_command, "run_eval", fake)
    cli.main(["eval", "--suite", "webshop", "--catalog-size", "50", "--warm-pool", "3", "--out", "/tmp/unused"])
    cli.main(["eval", "--suite", "webshop", "--catalog-size", "50", "--out", "/tmp/unused"])
    assert seen == [3, None]


def test_ksm_flag_sets_the_suites_ksm_knob_and_is_refused_where_nothing_would_opt_in() -> None:
    """``--ksm on|off`` is the web shop's ``ksm`` knob: with Chromium its workspaces (and the warm pool's slots)
    declare ``merge_memory``, which has the runtime tune ksmd; without Chromium, or on a suite without a browser, it
    is refused naming the flag; ``bench memory --compare-ksm`` runs both and refuses it."""
    import pytest

    from bunshin.engine.commands.flags import make_suite
    from bunshin.engine.errors import CommandError

    on = make_suite(parse(*EVAL, "--browser", "chromium", "--ksm", "on")).app()
    assert on.merge_memory and on.kwargs["ksm"] and on.warm is not None and on.warm.merge_memory
    off = make_suite(parse(*EVAL, "--browser", "chromium", "--ksm", "off")).app()
    assert not off.merge_memory and not off.warm.merge_memory  # type: ignore[union-attr]
    assert not make_suite(parse(*EVAL, "--browser", "chromium")).app().merge_memory  # default off
    with pytest.raises(CommandError, match="--ksm on: only Chromium workspaces opt into KSM"):
        make_suite(parse(*EVAL, "--ksm", "on"))
    with pytest.raises(CommandError, match="--ksm on: suite desktop has no browser"):
        make_suite(parse("eval", "--suite", "desktop", "--out", "/tmp/never", "--ksm", "on"))
    proc = bunshin("bench", "memory", "--suite", "webshop", "--browser", "chromium", "--compare-ksm", "--ksm", "on")
    assert proc.returncode != 0 and "--compare-ksm runs both: leave out --ksm" in proc.stderr


def test_replay_takes_the_recorded_knobs_unless_the_command_line_names_them(tmp_path: Path) -> None:
    from bunshin.engine.commands.replay_command import recorded_knobs
    from bunshin.engine.errors import CommandError

    recording = tmp_path / "trajectories.jsonl"
    assert recorded_knobs(recording, []) == {}  # no summary beside it: nothing recorded
    (tmp_path / "summary.json").write_text(json.dumps({"rollouts": 1}))
    assert recorded_knobs(recording, []) == {}  # an older eval's summary
    (tmp_path / "summary.json").write_text(json.dumps({"knobs": {"browser": "chromium", "ksm": True,
                                                                 "catalog_size": 500, "time_scale": 0.05}}))
    assert recorded_knobs(recording, []) == {"browser": "chromium", "ksm": True, "catalog_size": 500,
                                             "time_scale": 0.05}
    assert recorded_knobs(recording, ["browser", "ksm", "catalog_size"]) == {"time_scale": 0.05}
    (tmp_path / "summary.json").write_text("{not json")
    with pytest.raises(CommandError, match="summary.json: cannot read the recording's knobs"):
        recorded_knobs(recording, [])


def test_images_list_and_build_say_what_is_built_and_refuse_what_is_not_declared() -> None:
    listed = bunshin("images", "list")
    assert listed.returncode == 0, listed.stderr
    assert any(line.startswith("image base ") and " built " in line for line in listed.stdout.splitlines())
    again = bunshin("images", "build", "base")  # built already: nothing to do, and it says so in the table
    assert again.returncode == 0 and "building" not in again.stderr and "image base " in again.stdout
    nothing = bunshin("images", "build")
    assert nothing.returncode != 0 and "name the images, or --all" in nothing.stderr
    unknown = bunshin("images", "build", "nope")
    assert unknown.returncode != 0 and "unknown workspace image 'nope'; declared: base" in unknown.stderr


def test_bench_desktop_measures_a_real_desktop_and_writes_its_json_and_plot(tmp_path: Path) -> None:
    out, plot = tmp_path / "desktop.json", tmp_path / "desktop.png"
    proc = bunshin("bench", "desktop", "--repeat", "1", "--calls", "1", "--concurrency", "1", "--window", "1",
                   "--json", str(out), "--plot", str(plot))
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = {row["what"].split(" (")[0]: row for row in data["per_desktop"]}
    assert rows["create to a session that answers"]["p50"] > 0 and rows["PSS after set-up"]["p50"] > 100  # MiB
    assert rows["screenshot"]["n"] == 1 and data["concurrent"][0]["desktops"] == 1
    assert plot.stat().st_size > 10_000


def test_the_command_line_names_a_daemon_down_and_refuses_a_backend_beside_the_docker_runtime(
        tmp_path: Path) -> None:
    env = dict(os.environ, BUNSHIN_DOCKER_HOST="unix:///nonexistent/docker.sock")
    bunshin = [sys.executable, "-m", "bunshin.engine.cli"]
    down = subprocess.run([*bunshin, "eval", "--suite", "webshop", "--runtime", "docker", "--limit", "1", "--out",
                           str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 1 and "Traceback" not in down.stderr
    assert "DockerUnavailable: no Docker daemon answers at unix:///nonexistent/docker.sock" in down.stderr
    both = subprocess.run([*bunshin, "eval", "--suite", "webshop", "--runtime", "docker", "--backend", "kmod",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert both.returncode == 1 and "drop --backend kmod" in both.stderr
    bad = subprocess.run([*bunshin, "eval", "--suite", "webshop", "--image", "docker:", "--out",
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "not a Docker image reference" in bad.stderr
