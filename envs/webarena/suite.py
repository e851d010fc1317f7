"""The suite ``webarena``: WebArena's own tasks on a user's deployment of its sites, run by the engine like any suite
(``bunshin eval --suite webarena --task-file test.raw.json --site shopping=URL ...``).

Owns: the tasks of the task file prepared for the deployment (``task_file.py``; the refused ones in ``refused()``
with their reasons), each task's workspace (``app.py``'s Chromium on the image ``chromium``, its egress exactly the
task's sites: ``AppSpec.egress``), its start as WebArena's harness starts it (signed in to each of its sites with
WebArena's account when ``require_login``, then its start URLs), WebArena's action language (the web shop's:
``envs/webshop/suite.WebArenaActions``), scoring with WebArena's evaluators against the deployment (``judge.py``),
and WebArena's reset between groups when given (``reset.py``). A task file's own ``bunshin_reference`` (ours;
WebArena's tasks have none) is its reference solution, elements named by role and name.
Knobs: ``task_file`` (default libwebarena's ``test.raw.json``), ``sites`` (``NAME=URL`` items; the ``WA_*``
variables fill the others), ``judge`` (an OpenAI-compatible server's URL for ``fuzzy_match``, ``llm_judge.py``;
without one those tasks are refused) and ``judge_model`` (default: the first it serves; the key, if it needs one,
in ``BUNSHIN_JUDGE_API_KEY``), ``full_reset`` (WebArena's reset server, default ``WA_FULL_RESET``: the deployment
is reset before every group and the groups run one at a time; without one the summary says the rollouts shared the
sites) and ``reset_poll_s``, ``screenshots``.
Must never: run a task the deployment cannot serve or evaluate (refused when loaded), or score one whose
evaluation could not run (``judge.EvaluationFailed``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..records import AppSpec, Observation, ToolCall
from ..suites.base import Refusal, SuiteTask, checked
from ..suites.webarena import WebArenaTask
from ..webshop.suite import WebArenaActions, reference_call
from ..webshop.tools import FINAL
from ..workspace import Workspace
from . import judge, reset
from .llm_judge import OpenAIJudge
from .sign_in import RECIPES
from .sites import Deployment
from .task_file import Loaded, libwebarena_tasks, load

SITES_APP = "bunshin.envs.webarena.app:SitesApp"


class WebArenaSuite(WebArenaActions):
    name = "webarena"
    setup_timeout_s = 120.0  # signing in to a real site and loading its start pages

    def __init__(self, task_file: str | None = None, sites: list[str] | None = None, screenshots: bool = True,
                 judge: str | None = None, judge_model: str | None = None, full_reset: str | None = None,
                 reset_poll_s: float = reset.POLL_S):
        self.deployment = Deployment.parse(sites or [], os.environ)
        self.task_file = Path(task_file) if task_file else None
        self.screenshots = screenshots
        self.llm = OpenAIJudge(judge, judge_model, os.environ.get("BUNSHIN_JUDGE_API_KEY")) if judge else None
        # WebArena's reset server (``WA_FULL_RESET``): the deployment is reset before every group, one group at a time
        self.full_reset = full_reset or os.environ.get("WA_FULL_RESET") or None
        self.reset_poll_s = reset_poll_s
        self.exclusive_groups = self.full_reset is not None
        self.resets: list[float] = []  # the seconds each reset of this run took
        self.knobs = {"task_file": str(task_file or "libwebarena"), "sites": sorted(
            f"{name}={site.url}" for name, site in self.deployment.sites.items()), "screenshots": screenshots,
            "judge": judge, "judge_model": judge_model, "full_reset": self.full_reset}
        self.loaded: Loaded | None = None
        self._specs: dict[str, WebArenaTask] = {}

    def tasks(self) -> list[SuiteTask]:
        """The task file's tasks the deployment can run (those it cannot are in ``refused()``)."""
        path = self.task_file if self.task_file is not None else libwebarena_tasks()
        self.loaded = load(path, self.deployment, judge=self.llm is not None)
        out = []
        for spec in self.loaded.tasks:
            reference = [reference_call(step, path) for step in spec.bunshin_reference]
            template = spec.bunshin_template or (f"template_{spec.intent_template_id}"
                                                 if spec.intent_template_id is not None else "webarena")
            self._specs[str(spec.task_id)] = spec
            out.append(SuiteTask(suite=self.name, id=str(spec.task_id), template=template, instruction=spec.intent,
                                 path=str(path), reference=reference))
        return out

    def refused(self) -> list[Refusal]:
        return list(self.loaded.refused) if self.loaded is not None else []

    def report(self, ran: list[str]) -> dict[str, Any]:
        """The run's ``webarena`` summary: the task file's tasks prepared and refused by site and evaluator, the
        tasks rolled out by site and evaluator, and the sites those rollouts shared without a reset between them
        (WebArena's sites keep state: an order one rollout placed is there for the next; no reset protocol ran)."""
        run_sites: dict[str, int] = {}
        run_evals: dict[str, int] = {}
        for task_id in ran:
            spec = self._specs.get(task_id)
            for site in spec.sites if spec is not None else []:
                run_sites[site] = run_sites.get(site, 0) + 1
            for kind in spec.eval.eval_types if spec is not None else []:
                run_evals[kind] = run_evals.get(kind, 0) + 1
        sites = f"site{'s' if len(run_sites) > 1 else ''} {', '.join(sorted(run_sites))}"
        if not ran:
            notes = []
        elif self.full_reset is None:
            notes = [f"the rollouts shared the {sites} without a reset between them (WebArena's sites keep state; "
                     f"no reset server was given: WA_FULL_RESET or --set full_reset=URL)"]
        else:
            notes = [f"the deployment was reset before each of the {len(self.resets)} groups that started (one group "
                     f"at a time; {sum(self.resets):.0f} s of resets); the samples of a group shared the {sites}"]
        return {"webarena": {"tasks": self.loaded.counts() if self.loaded is not None else {},
                             "ran_by_site": run_sites, "ran_by_evaluator": run_evals,
                             "shared_without_reset": sorted(run_sites) if self.full_reset is None else [],
                             "resets_s": [round(r, 1) for r in self.resets]}, "notes": notes}

    async def before_group(self, task: SuiteTask) -> None:
        """With a reset server: the deployment reset (``reset.full_reset``) before the group sets up."""
        if self.full_reset is not None:
            self.resets.append(await reset.full_reset(self.full_reset, poll_s=self.reset_poll_s))

    def app(self, task: SuiteTask | None = None) -> AppSpec:
        """Chromium on the image ``chromium``, reaching the task's sites (every site given, without a task)."""
        names = self._specs[task.id].sites if task is not None else list(self.deployment.sites)
        egress = sorted({f"{s.host}:{s.port}" for n in names for s in [self.deployment.sites[n]]})
        return AppSpec(target=SITES_APP, kwargs={"screenshots": self.screenshots}, image="chromium", egress=egress)

    async def start(self, ws: Workspace, task: SuiteTask) -> Observation:
        spec = self._specs[task.id]
        if spec.require_login:
            for site in spec.sites:
                if site in RECIPES:
                    await checked(ws, "_sign_in", {"site": site, "url": self.deployment.sites[site].url})
        urls = [u.strip() for u in spec.start_url.split("|AND|") if u.strip()]
        return await checked(ws, "_start", {"urls": urls})

    def nondeterministic(self, call: ToolCall) -> bool:
        """A deployment's site is shared and changes under the run (other rollouts, its own clock): no step is
        replayed from the prefix cache."""
        return True

    async def evaluate(self, ws: Workspace, task: SuiteTask, final: ToolCall) -> float:
        answer = str(final.args.get("answer", "")) if final.name == FINAL else ""
        return await judge.score(ws, self._specs[task.id], answer, self.deployment, self.llm)
