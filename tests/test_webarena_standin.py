"""WebArena's own tasks run on a deployment (``--suite webarena``), with the embedded shop served outside any
workspace standing in for WebArena's shopping site: task files in WebArena's format (``__SHOPPING__`` placeholders,
``require_login``, string_match, url_match, program_html with JavaScript locators on the agent's page and on URLs,
``func:shopping_get_latest_order_url()`` and the review helpers through the REST API) score 1 with their reference
solutions and 0 without; a task a judge would score is refused; a site that does not answer, a login that fails are
typed failures, the rest goes on."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from bunshin.engine.commands.suite_check import attempt
from bunshin.envs import Limits, WorkspaceRuntime
from bunshin.envs.webarena.suite import WebArenaSuite
from bunshin.envs.webshop import tasks as shop_tasks

from .shop_server import serve_in_thread, serve_shop

# the embedded suite's own task files: they are in WebArena's format; one per evaluator kind
TASKS = {"7": "string_match", "33": "url_match", "45": "program_html, JS on the cart page (the agent's cookie)",
         "56": "program_html, the review helpers (REST, admin token)",
         "54": "program_html, func:shopping_get_latest_order_url() then JS", "69": "fuzzy_match: refused, no judge"}
LIMITS = Limits(memory_bytes=4 << 30, pids=512, command_timeout_s=60)


def task_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "config_files"
    directory.mkdir()
    files = {path.stem: path for path in shop_tasks.task_files()}
    for task_id in TASKS:
        shutil.copy(files[task_id], directory / f"{task_id}.json")
    return directory


@pytest.mark.asyncio
async def test_webarena_tasks_score_as_their_references_on_the_stand_in_deployment(
        make_runtime, tmp_path: Path) -> None:
    rt: WorkspaceRuntime = await make_runtime(limits=LIMITS)
    directory = task_dir(tmp_path)
    serving = serve_shop(catalog_size=shop_tasks.DEFAULT_CATALOG_SIZE)  # the catalog the task files name
    shop = await asyncio.to_thread(serving.__enter__)  # building 20,000 products: off the loop
    try:
        suite = WebArenaSuite(task_file=str(directory), sites=[f"shopping={shop.url}"])
        tasks = {t.id: t for t in suite.tasks()}
        assert sorted(tasks, key=int) == ["7", "33", "45", "54", "56"]
        (refused,) = suite.refused()
        assert refused.file.endswith("69.json") and "fuzzy_match needs a judge model" in refused.reason
        app = suite.app(tasks["7"])
        assert app.egress == [f"127.0.0.1:{shop.url.rsplit(':', 1)[1]}"] and app.image == "chromium"
        base = await rt.create(app)
        try:
            # the null attempt first: the site keeps what the reference does (an order, a review), as WebArena's do
            for task_id in ("7", "33", "45", "54", "56"):
                null, why, broke = await attempt(suite, base, tasks[task_id], [suite.null_action()])
                assert (null, broke) == (0.0, False), (task_id, why)
                score, why, broke = await attempt(suite, base, tasks[task_id], tasks[task_id].reference)
                assert (score, broke) == (1.0, False), (task_id, TASKS[task_id], why)
        finally:
            await base.close()
        signed = [r for r in shop.requests if r.path == "/customer/account/loginPost/"]
        assert len(signed) == 10  # every attempt's workspace signed in first (require_login)
    finally:
        await asyncio.to_thread(serving.__exit__, None, None, None)


def test_a_site_that_does_not_answer_or_a_refused_sign_in_fails_those_rollouts_and_the_batch_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from bunshin.engine.cli import main
    from bunshin.envs.webshop import store

    directory = task_dir(tmp_path)
    for task_id in ("54", "56", "69"):
        (directory / f"{task_id}.json").unlink()
    free = json.loads((directory / "33.json").read_text())  # a task that signs in to nothing
    (directory / "33.json").write_text(json.dumps({**free, "require_login": False}))

    def run(site: str, out: Path) -> list[dict[str, object]]:
        assert main(["eval", "--suite", "webarena", "--task-file", str(directory), "--site", f"shopping={site}",
                     "--group-size", "1", "--concurrency", "2", "--out", str(out)]) == 0
        return [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]

    # nothing answers at that address: every rollout fails at its set-up, naming the site; the run ends normally
    dead = run("http://127.0.0.1:1", tmp_path / "dead")
    assert {str(t["task_id"]): t["status"] for t in dead} == {"7": "setup_failed", "45": "setup_failed",
                                                                "33": "setup_failed"}
    assert all("does not answer" in str(t["error"]) for t in dead), dead
    # the site takes another password than WebArena's: the tasks that sign in fail, the one that does not runs
    monkeypatch.setitem(store.CUSTOMER, "password", "not WebArena's")
    with serve_shop(catalog_size=shop_tasks.DEFAULT_CATALOG_SIZE) as shop:
        refused = run(shop.url, tmp_path / "refused")
    by_task = {str(t["task_id"]): t for t in refused}
    assert by_task["7"]["status"] == by_task["45"]["status"] == "setup_failed"
    assert "sign-in to shopping" in str(by_task["7"]["error"]) and "was refused" in str(by_task["7"]["error"])
    assert by_task["33"]["status"] == "ok" and by_task["33"]["error"] is None, by_task["33"]


from .test_openai_policy import openai_server  # noqa: E402,F401  (the real scripted model server, as a fixture)


@pytest.mark.asyncio
async def test_fuzzy_match_asks_the_judge_model_and_a_judge_that_is_down_fails_the_evaluation(
        make_runtime, openai_server, tmp_path: Path) -> None:  # noqa: F811
    import json

    rt: WorkspaceRuntime = await make_runtime(limits=LIMITS)
    directory = task_dir(tmp_path)
    for path in directory.iterdir():
        if path.stem not in ("7", "69"):
            path.unlink()
    fuzzy = json.loads((directory / "7.json").read_text())  # the same task, its answer judged by the model
    fuzzy["task_id"] = 1007
    fuzzy["eval"]["reference_answers"] = {"fuzzy_match": ["White"]}
    (directory / "7.json").write_text(json.dumps(fuzzy))
    judge = openai_server([{"content": "The student answer is Correct."}, {"content": "incorrect"},
                           {"content": "different"}])
    serving = serve_shop(catalog_size=shop_tasks.DEFAULT_CATALOG_SIZE)
    shop = await asyncio.to_thread(serving.__enter__)
    try:
        suite = WebArenaSuite(task_file=str(directory), sites=[f"shopping={shop.url}"], judge=judge.url)
        tasks = {t.id: t for t in suite.tasks()}
        assert sorted(tasks) == ["1007", "69"] and not suite.refused()
        base = await rt.create(suite.app(tasks["69"]))
        try:
            results = [await attempt(suite, base, tasks[task_id], calls) for task_id, calls in [
                ("1007", tasks["1007"].reference), ("1007", [suite.null_action()]),
                ("69", tasks["69"].reference), ("69", [suite.null_action()])]]
            assert [(score, broke) for score, _, broke in results] == [(1.0, False), (0.0, False), (1.0, False),
                                                                       (0.0, False)], results
            asked = [body["messages"][1]["content"] for body in judge.chat_bodies()]
            assert len(asked) == 3  # "N/A" for the unachievable task is an exact match: no question
            assert "reference answer: White" in asked[0] and "student answer: White" in asked[0]
            assert "student answer: \n" in asked[1]
            assert asked[2].startswith("task: ") and "actual unachievable reason: the product does not exist" in asked[2]
            # the judge went away: the evaluation fails, naming it; no score is made up
            down = WebArenaSuite(task_file=str(directory), sites=[f"shopping={shop.url}"],
                                 judge="http://127.0.0.1:1/v1", judge_model="judge")
            down_tasks = {t.id: t for t in down.tasks()}
            score, why, broke = await attempt(down, base, down_tasks["1007"], down_tasks["1007"].reference)
            assert (score, broke) == (0.0, True) and "judge http://127.0.0.1:1/v1" in str(why), why
        finally:
            await base.close()
    finally:
        await asyncio.to_thread(serving.__exit__, None, None, None)


def test_a_reset_server_resets_the_deployment_before_each_group_one_group_at_a_time(
        tmp_path: Path) -> None:
    """WebArena's reset protocol (webarena-setup's reset server: GET /reset, then /status until ready): the suite
    resets before every group and runs one group at a time, so no page of the site is asked for while a reset
    runs; a reset that fails fails that group's rollouts at set-up, naming the server, and the run goes on."""
    import http.server
    import json
    import threading
    import time

    from bunshin.engine.cli import main

    from .shop_server import RecordingShop

    asked: list[float] = []

    class Timed(RecordingShop):
        def route(self, raw_path: str, session: str = "") -> tuple[int, str, str | bytes]:
            asked.append(time.monotonic())
            return super().route(raw_path, session)

    resets: list[tuple[float, float]] = []
    state = {"running": False, "failed": "", "calls": 0}

    class ResetServer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == "/reset":
                state["calls"] += 1
                if state["running"]:
                    return self._say(418, "Reset already running")
                state["running"] = True

                def run(first: bool = state["calls"] == 1) -> None:
                    began = time.monotonic()
                    time.sleep(1.0)  # the reset script
                    state["failed"] = "reset.sh exited with 1" if first else ""
                    resets.append((began, time.monotonic()))
                    state["running"] = False

                threading.Thread(target=run, daemon=True).start()
                return self._say(200, "Reset initiated")
            if self.path == "/status":
                if state["running"]:
                    return self._say(200, "Reset ongoing")
                return self._say(500, f"Error executing reset script: {state['failed']}") if state["failed"] \
                    else self._say(200, "Ready for duty!")
            return self._say(404, "Endpoint not found")

        def _say(self, status: int, text: str) -> None:
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    directory = task_dir(tmp_path)
    for task_id in ("54", "56", "69"):
        (directory / f"{task_id}.json").unlink()
    with serve_in_thread(http.server.ThreadingHTTPServer(("127.0.0.1", 0), ResetServer)) as reset_port, \
            serve_shop(catalog_size=shop_tasks.DEFAULT_CATALOG_SIZE, shop_class=Timed) as shop:
        out = tmp_path / "run"
        assert main(["eval", "--suite", "webarena", "--task-file", str(directory), "--site", f"shopping={shop.url}",
                     "--set", f"full_reset=http://127.0.0.1:{reset_port}/reset",
                     "--set", "reset_poll_s=0.2", "--group-size", "2", "--concurrency", "4", "--out",
                     str(out)]) == 0
    trajectories = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    failed = [t for t in trajectories if t["status"] != "ok"]
    assert len(resets) == 3 and len(failed) == 2, trajectories  # the first reset failed: its group's two samples
    assert all(t["status"] == "setup_failed" and "/status answered 500" in t["error"]
               and "reset.sh exited with 1" in t["error"] for t in failed)
    assert len({t["group_id"] for t in failed}) == 1 and len(trajectories) == 6
    # one group at a time: no page of the site was asked for while a reset ran
    assert not [t for t in asked for began, ended in resets if began <= t <= ended]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["webarena"]["shared_without_reset"] == [] and len(summary["webarena"]["resets_s"]) == 2
    assert "reset before each of the 2 groups" in summary["notes"][0]
