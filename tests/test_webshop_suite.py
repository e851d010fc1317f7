"""The web shop suite end to end on real workspaces: every template's reference solution scores 1 and giving up
scores 0 (through ``bunshin suite check``'s own procedure), forking mid-task, malformed actions, task files we
must refuse, the committed task files, and the memory a forked shop keeps sharing."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from bunshin.engine.commands.suite_check import check
from bunshin.envs import ToolCall
from bunshin.envs.runtime.page_sharing import compare, page_set
from bunshin.envs.suites import webarena
from bunshin.envs.suites.base import ActionError, SuiteTask, play
from bunshin.envs.webshop import tasks as generator
from bunshin.envs.webshop.suite import WebShopSuite

CATALOG = 2000


@pytest.fixture(scope="module")
def all_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("webshop-tasks")
    generator.write(directory, generator.generate(CATALOG, 0))
    return directory


@pytest.fixture(scope="module")
def one_per_template(tmp_path_factory: pytest.TempPathFactory, all_tasks: Path) -> Path:
    directory = tmp_path_factory.mktemp("webshop-templates")
    seen = set()
    for path in sorted(all_tasks.glob("*.json"), key=lambda p: int(p.stem)):
        task = json.loads(path.read_text())
        if task["bunshin_template"] not in seen:
            seen.add(task["bunshin_template"])
            (directory / path.name).write_text(path.read_text())
    return directory


def small_suite(directory: Path) -> WebShopSuite:
    return WebShopSuite(catalog_size=CATALOG, tasks_dir=directory, time_scale=0.0)


def by_template(suite: WebShopSuite, template: str, index: int = 0):
    return [t for t in suite.tasks() if t.template == template][index]


TEMPLATE_NAMES = ("review_count", "product_attribute", "cheapest_in_category", "order_total", "search_for",
                  "category_sorted", "add_to_cart", "checkout", "write_review", "unachievable")


def test_tasks_cover_ten_templates_and_seventy_tasks() -> None:
    suite = WebShopSuite()
    tasks = suite.tasks()
    assert len(tasks) == 70 and len({t.id for t in tasks}) == 70
    by_template: dict[str, int] = {}
    for t in tasks:
        by_template[t.template] = by_template.get(t.template, 0) + 1
    assert by_template == {name: 7 for name in TEMPLATE_NAMES}  # the ten templates, seven tasks each
    assert tuple(generator.TEMPLATES) == TEMPLATE_NAMES
    kinds = {k for t in tasks for k in webarena.load_task(t.path).eval.eval_types}
    assert kinds == {"string_match", "url_match", "program_html"}
    assert all(suite.is_final(t.reference[-1]) for t in tasks)


def test_committed_task_files_are_what_the_generator_makes(tmp_path: Path) -> None:
    generator.write(tmp_path, generator.generate())
    committed = {p.name: p.read_text() for p in generator.COMMITTED.glob("*.json")}
    assert committed == {p.name: p.read_text() for p in tmp_path.glob("*.json")}


@pytest.mark.asyncio
async def test_every_template_reference_scores_1_and_giving_up_scores_0(runtime, one_per_template) -> None:
    suite = small_suite(one_per_template)
    report = await check(suite, runtime=runtime, concurrency=2, log=io.StringIO())
    assert report["tasks"] == len(generator.TEMPLATES)
    assert report["failures"] == []
    assert report["oracle_pass"] == report["tasks"] and report["null_pass"] == 0
    assert report["null_pass_expected"] == []


@pytest.mark.asyncio
async def test_wrong_answers_score_0_for_every_evaluator(runtime, all_tasks) -> None:
    suite = small_suite(all_tasks)
    base = await runtime.create(suite.app())
    # string_match: a wrong number; url_match: the wrong category order; program_html: the wrong quantity
    count = by_template(suite, "review_count")
    ws = await base.fork()
    await suite.start(ws, count)
    async for _ in play(suite, ws, count, count.reference):
        pass
    right = count.reference[-1]
    assert await suite.evaluate(ws, count, right) == 1.0
    wrong = ToolCall(name="stop", args={"answer": str(int(right.args["answer"]) + 10)})
    assert await suite.evaluate(ws, count, wrong) == 0.0

    sorted_task = by_template(suite, "category_sorted")
    ws = await base.fork()
    await suite.start(ws, sorted_task)
    steps = sorted_task.reference[:1]  # the category, but not the asked order
    async for _ in play(suite, ws, sorted_task, steps):
        pass
    assert await suite.evaluate(ws, sorted_task, suite.null_action()) == 0.0

    cart = by_template(suite, "add_to_cart", 1)  # asks for 2
    ws = await base.fork()
    await suite.start(ws, cart)
    wrong_qty = [c if c.name != "type" or c.args["element_id"] != "@textbox 'Qty'" else
                 ToolCall(name="type", args={**c.args, "text": "5"}) for c in cart.reference]
    async for _, obs in play(suite, ws, cart, wrong_qty):
        assert obs.error is None
    assert await suite.evaluate(ws, cart, suite.null_action()) == 0.0


@pytest.mark.asyncio
async def test_a_fork_mid_checkout_finishes_on_its_own(runtime, all_tasks) -> None:
    suite = small_suite(all_tasks)
    task = by_template(suite, "checkout")
    other = by_template(suite, "checkout", 1)  # another address
    ws = await runtime.create(suite.app())
    await suite.start(ws, task)
    head = task.reference[:4]  # search, product, add to cart, proceed to checkout
    async for _, obs in play(suite, ws, task, head):
        assert obs.error is None
    clone = await ws.fork()
    # the clone ships to the other task's address, the source to its own
    async for _, obs in play(suite, clone, other, other.reference[4:]):
        assert obs.error is None
    async for _, obs in play(suite, ws, task, task.reference[4:]):
        assert obs.error is None
    assert await suite.evaluate(ws, task, task.reference[-1]) == 1.0
    assert await suite.evaluate(clone, task, task.reference[-1]) == 0.0  # wrong address for this task
    mine = await ws.execute(ToolCall(name="_page_text", args={"url": "/sales/order/history/", "selector": ""}))
    theirs = await clone.execute(ToolCall(name="_page_text", args={"url": "/sales/order/history/",
                                                                   "selector": ""}))
    first, last = task.reference[4].args["text"], task.reference[5].args["text"]
    assert f"{first} {last}" in mine.output and f"{first} {last}" not in theirs.output
    assert mine.output.count("View Order 000000013") == theirs.output.count("View Order 000000013") == 1
    back = await clone.execute(ToolCall(name="go_back", args={}))
    assert back.error is None and "Checkout" in back.data["title"]  # the clone's own history


@pytest.mark.asyncio
async def test_malformed_actions_are_observations_and_the_workspace_goes_on(runtime, all_tasks) -> None:
    suite = small_suite(all_tasks)
    for text, culprit in [("fly [3]", "fly"), ("click [abc]", "abc"), ("click", "click"),
                          ("scroll [sideways]", "sideways"), ("type [3]", "type"), ("tab_focus [x]", "x")]:
        with pytest.raises(ActionError, match=culprit):
            suite.parse_action(text)
    task = by_template(suite, "review_count")
    ws = await runtime.create(suite.app())
    first = await suite.start(ws, task)
    for call, expected in [
        (ToolCall(name="fly", args={}), "unknown tool 'fly'"),
        (ToolCall(name="click", args={"element_id": 99999}), "no element [99999]"),
        (ToolCall(name="click", args={"element_id": "12"}), "element_id"),
        (ToolCall(name="type", args={"element_id": 11}), "text"),
        (ToolCall(name="tab_focus", args={"tab_index": 7}), "tab"),
        (ToolCall(name="goto", args={"url": "ftp://example.com/"}), "only http"),
    ]:
        obs = await ws.execute(call)
        assert obs.error and expected in obs.error, (call, obs.error)
    link = next(line for line in first.output.splitlines() if "link 'My Account'" in line)
    obs = await ws.execute(ToolCall(name="type", args={"element_id": int(link.split("[")[1].split("]")[0]),
                                                       "text": "x", "press_enter_after": False}))
    assert obs.error  # typing into a link
    again = await ws.execute(ToolCall(name="observe", args={}))
    assert again.error is None and again.output == first.output  # nothing changed the page
    async for _, obs in play(suite, ws, task, task.reference):
        assert obs.error is None
    assert await suite.evaluate(ws, task, task.reference[-1]) == 1.0


@pytest.mark.asyncio
async def test_observations_carry_a_1280x720_screenshot(runtime, all_tasks) -> None:
    suite = small_suite(all_tasks)
    ws = await runtime.create(suite.app())
    obs = await suite.start(ws, by_template(suite, "order_total"))
    assert obs.output.startswith("Tab 0 (current): Home Page")
    image = Image.open(io.BytesIO(obs.data["screenshot"]))
    assert image.format == "PNG" and image.size == (1280, 720)


def _write(tmp_path: Path, task: dict) -> Path:
    path = tmp_path / "task.json"
    path.write_text(json.dumps(task))
    return path


@pytest.mark.parametrize("edit, field", [
    (lambda t: t["eval"]["program_html"][0].update(locator="document.querySelectorAll('.x')[0].innerText"),
     "eval.program_html[0].locator"),
    (lambda t: t["eval"]["program_html"][0].update(url="func:reddit_get_post_url('__last_url__')"),
     "eval.program_html[0].url"),
    (lambda t: t["eval"]["program_html"][0].update(required_contents={"regex": "x"}),
     "eval.program_html[0].required_contents"),
    (lambda t: t["eval"].update(eval_types=["program_html", "html_visual"]), "eval.eval_types"),
    (lambda t: t.pop("intent"), "`intent`"),
    (lambda t: t.update(sites=["shopping", "gitlab"]), "sites"),
])
def test_task_files_we_cannot_run_are_refused_with_path_and_field(tmp_path: Path, edit, field) -> None:
    committed = [json.loads(p.read_text()) for p in generator.COMMITTED.glob("*.json")]
    task = next(t for t in committed if t["bunshin_template"] == "add_to_cart")
    edit(task)
    path = _write(tmp_path, task)
    with pytest.raises(webarena.TaskFileError) as info:
        webarena.load_task(path)
    assert str(path) in str(info.value) and field in str(info.value)


def test_a_task_without_a_reference_solution_is_refused(tmp_path: Path) -> None:
    task = json.loads((generator.COMMITTED / "0.json").read_text())
    del task["bunshin_reference"]
    (tmp_path / "0.json").write_text(json.dumps(task))
    with pytest.raises(webarena.TaskFileError, match="bunshin_reference"):
        WebShopSuite(tasks_dir=tmp_path).tasks()
    task["bunshin_reference"] = ["click [@link 'My Account']"]  # never stops
    (tmp_path / "0.json").write_text(json.dumps(task))
    with pytest.raises(webarena.TaskFileError, match="must end with a stop"):
        WebShopSuite(tasks_dir=tmp_path).tasks()


def plans(tasks: list[SuiteTask], steps: int, template: str) -> tuple[SuiteTask, list[ToolCall], list[ToolCall]]:
    """A fixed two-sample workload: A plays the reference solutions of a template's tasks 0, 2, 4..., B of 1, 3,
    5... (the sharing benchmark's earlier procedure)."""
    group = [t for t in tasks if t.template == template]
    a = [c for t in group[0::2] for c in t.reference[:-1]]
    b = [c for t in group[1::2] for c in t.reference[:-1]]
    assert min(len(a), len(b)) >= steps, f"template {template!r} is too short for {steps} steps"
    return group[0], a[:steps], b[:steps]


@pytest.mark.asyncio
async def test_a_forked_shop_shares_at_least_half_its_memory_after_ten_actions(runtime) -> None:
    suite = WebShopSuite(time_scale=0.0)  # the default workload (what the memory benchmarks run), no modelled latency
    start, plan_a, plan_b = plans(suite.tasks(), 10, "add_to_cart")
    base = await runtime.create(suite.app(start))
    await suite.start(base, start)
    a, b = await base.fork(), await base.fork()
    await base.close()
    for call_a, call_b in zip(plan_a, plan_b, strict=True):
        for ws, call in ((a, call_a), (b, call_b)):
            assert (await ws.execute(await suite.concrete(ws, call))).error is None
    sharing = compare(await asyncio.to_thread(page_set, a.cgroup.procs()),
                      await asyncio.to_thread(page_set, b.cgroup.procs()))
    assert sharing.physically_shared_fraction >= 0.5, sharing
    assert sharing.a_bytes > 200 << 20  # the default workspace is a few hundred MB


def test_the_stylesheet_changes_nothing_the_text_browser_shows() -> None:
    """The Luma stylesheet (``envs/webshop/style.py``) is for Chromium: the text browser's tree of every kind of page,
    ids included, is the one it builds from the same page without it (a ``<style>`` before the content renumbered
    every element and changed every recorded trajectory once)."""
    from bunshin.envs.webshop import html
    from bunshin.envs.webshop.browser import accessibility, dom
    from bunshin.envs.webshop.catalog import Catalog
    from bunshin.envs.webshop.style import STYLE

    catalog = Catalog(50, 0)
    product = catalog[3]

    class Listed:  # what the listing pages take: a product with its page's url
        def __init__(self, p) -> None:
            self.sku, self.name, self.price, self.rating, self.reviews = p.sku, p.name, p.price, p.rating, p.reviews
            self.url, self.price_cents = "/p.html", p.price_cents

    listed = [Listed(catalog[i]) for i in range(12)]
    pages = [html.home(catalog.categories()), html.search_results("boots", listed, 30, 1, 3),
             html.product_page(product, [], related=listed[:4]), html.cart([(listed[0], 2)]),
             html.checkout([(listed[0], 1)], {}, ["city"])]
    for page in pages:
        assert f"<style>{STYLE}</style>" in page
        trees = [accessibility.build(dom.parse_html(markup), dom.page_title(dom.parse_html(markup))).text()
                 for markup in (page, page.replace(f"<style>{STYLE}</style>", ""))]
        assert trees[0] == trees[1]
