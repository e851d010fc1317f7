"""WebArena's own tasks on a user's deployment, before anything runs: the sites given (``--site``, ``WA_*``), each
URL checked; every task of a file prepared with its sites substituted or refused naming the site or the field; and
libwebarena's ``test.raw.json`` (812 tasks) counted by site and evaluator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bunshin.envs.suites.errors import TaskFileError
from bunshin.envs.webarena.sites import SITES, BadSite, Deployment
from bunshin.envs.webarena.task_file import libwebarena_tasks, load

SHOP = "http://127.0.0.1:7770"
ALL = [f"{name}=http://{name.replace('_', '-')}.example:{8000 + i}" for i, name in enumerate(SITES)]


def task(**over: object) -> dict[str, object]:
    """A WebArena task of the shopping site, as its config files have it."""
    base: dict[str, object] = {
        "sites": ["shopping"], "task_id": 1, "require_login": True, "storage_state": "./.auth/shopping_state.json",
        "start_url": "__SHOPPING__", "geolocation": None, "intent_template": "", "instantiation_dict": {},
        "intent": "Find the cart", "require_reset": False, "intent_template_id": 3,
        "eval": {"eval_types": ["url_match", "program_html"], "reference_answers": None,
                 "reference_url": "__SHOPPING__/checkout/cart/", "url_note": "GOLD in PRED",
                 "program_html": [{"url": "last", "locator": "document.querySelector('.cart').outerText",
                                   "required_contents": {"must_include": ["Qty: 1 |OR| Qty 1"]}}]}}
    base.update(over)
    return base


def test_sites_come_from_the_command_line_or_webarenas_variables_each_url_checked() -> None:
    d = Deployment.parse([f"shopping={SHOP}/"], {"WA_SHOPPING": "http://ignored:1", "WA_REDDIT": "https://r.example"})
    assert {n: s.url for n, s in d.sites.items()} == {"shopping": SHOP, "reddit": "https://r.example"}
    assert [(s.host, s.port) for s in d.sites.values()] == [("127.0.0.1", 7770), ("r.example", 443)]
    assert d.substitute("__SHOPPING__/a __REDDIT__/f __GITLAB__") == f"{SHOP}/a https://r.example/f __GITLAB__"
    assert d.missing(["gitlab", "shopping", "reddit"]) == ["gitlab"]
    assert Deployment.parse([f"shopping={SHOP}"]).sites.keys() == {"shopping"}  # no environ: no variables read
    for bad, says in [("shopping", "expected NAME=URL"), ("shop=http://h", "'shop' is not a WebArena site"),
                      ("shopping=ftp://h", "http:// or https://"), ("shopping=http://", "no host"),
                      ("shopping=http://h/?a=1", "query or a fragment"), ("shopping=http://h:99999", "site shopping")]:
        with pytest.raises(BadSite, match=says):
            Deployment.parse([bad])
    with pytest.raises(BadSite, match="given twice"):
        Deployment.parse([f"shopping={SHOP}", f"shopping={SHOP}"])


def test_a_task_is_prepared_with_its_sites_substituted(tmp_path: Path) -> None:
    file = tmp_path / "1.json"
    file.write_text(json.dumps(task()))
    loaded = load(file, Deployment.parse([f"shopping={SHOP}"]))
    assert not loaded.refused
    (t,) = loaded.tasks
    assert t.start_url == SHOP and t.eval.reference_url == f"{SHOP}/checkout/cart/"
    assert loaded.counts() == {"prepared": 1, "refused": 0, "by_site": {"shopping": {"prepared": 1}},
                               "by_evaluator": {"program_html": {"prepared": 1}, "url_match": {"prepared": 1}}}


@pytest.mark.parametrize("change, says", [
    ({"sites": ["shopping", "gitlab"]}, "needs site gitlab, not given (--site gitlab=URL or WA_GITLAB)"),
    ({"sites": ["shop"]}, "sites: ['shop'] are not WebArena sites"),
    ({"sites": "shopping"}, "sites: a list of site names is required"),
    ({"start_url": "__GITLAB__/x"}, "names __GITLAB__ (site gitlab) outside its sites ['shopping']"),
    ({"intent": 3}, "Expected `str`, got `int` - at `$.intent`"),
    ({"eval": {"eval_types": []}}, "eval.eval_types is empty"),
    ({"eval": {"eval_types": ["vibe_check"]}}, "eval.eval_types ['vibe_check'] are not WebArena evaluators"),
    ({"eval": {"eval_types": ["string_match"], "reference_answers": {"fuzzy_match": ["a cart"]}}},
     "eval.reference_answers.fuzzy_match needs a judge model"),
    ({"eval": {"eval_types": ["string_match"], "reference_answers": {"regex": "a"}}},
     "eval.reference_answers has ['regex']"),
    ({"eval": {"eval_types": ["url_match"], "reference_url": "__SHOPPING__/x", "url_note": "EXACT"}},
     "eval.url_note 'EXACT'"),
    ({"eval": {"eval_types": ["program_html"], "program_html": [
        {"url": "func:open_the_pod_bay_doors()", "locator": "", "required_contents": {"exact_match": "x"}}]}},
     "eval.program_html[0].url 'func:open_the_pod_bay_doors()'"),
    ({"eval": {"eval_types": ["program_html"], "program_html": [
        {"url": "last", "locator": "window.alert(1)", "required_contents": {"exact_match": "x"}}]}},
     "eval.program_html[0].locator 'window.alert(1)': not JavaScript on document"),
    ({"sites": ["reddit"], "start_url": "__REDDIT__", "eval": {"eval_types": ["program_html"], "program_html": [
        {"url": "last", "locator": "func:shopping_get_sku_latest_review_rating('B0')",
         "required_contents": {"exact_match": "80"}}]}},
     "eval.program_html[0] reads the shopping site's REST API"),
    ({"eval": {"eval_types": ["program_html"], "program_html": [
        {"url": "last", "locator": "", "required_contents": {"exact_match": "x", "must_include": ["y"]}}]}},
     "eval.program_html[0].required_contents must have exactly one of"),
])
def test_a_task_we_cannot_run_is_refused_naming_the_site_or_the_field(tmp_path: Path, change: dict[str, object],
                                                                      says: str) -> None:
    file = tmp_path / "1.json"
    file.write_text(json.dumps(task(**change)))
    loaded = load(file, Deployment.parse([f"shopping={SHOP}", "reddit=http://r:1"]))
    assert not loaded.tasks
    (refusal,) = loaded.refused
    assert refusal.file == str(file) and says in refusal.reason, refusal.reason


def test_one_bad_entry_never_stops_the_others(tmp_path: Path) -> None:
    listing = tmp_path / "tasks.json"
    listing.write_text(json.dumps([task(task_id=1), "not a task", task(task_id=1), task(task_id=2, sites=["map"])]))
    loaded = load(listing, Deployment.parse([f"shopping={SHOP}"]))
    assert [t.task_id for t in loaded.tasks] == [1]
    assert [(r.file, r.reason.split(" (")[0]) for r in loaded.refused] == [
        (f"{listing}[1]", "a task is a JSON object, not str"), (f"{listing}[2]", "task_id 1 is given twice"),
        (f"{listing}[3]", "needs site map, not given")]
    assert loaded.counts()["by_site"] == {"shopping": {"prepared": 1, "refused": 1}, "map": {"refused": 1}}
    directory = tmp_path / "config_files"
    directory.mkdir()
    (directory / "10.json").write_text(json.dumps(task(task_id=10)))
    (directory / "2.json").write_text(json.dumps(task(task_id=2)))
    (directory / "3.json").write_text("{not json")
    loaded = load(directory, Deployment.parse([f"shopping={SHOP}"]))
    assert [t.task_id for t in loaded.tasks] == [2, 10]
    assert [Path(r.file).name for r in loaded.refused] == ["3.json"] and "not JSON" in loaded.refused[0].reason
    with pytest.raises(TaskFileError, match="cannot read"):
        load(tmp_path / "absent.json", Deployment())


def test_libwebarenas_812_tasks_are_each_prepared_or_refused_and_counted() -> None:
    try:
        path = libwebarena_tasks()
    except TaskFileError:
        pytest.skip("libwebarena is not installed (./scripts/setup.sh --browsergym)")
    # every site, a judge: every task is prepared
    everything = load(path, Deployment.parse(ALL), judge=True)
    assert everything.counts()["prepared"] == 812 and not everything.refused
    assert everything.counts()["by_evaluator"] == {"program_html": {"prepared": 411},
                                                   "string_match": {"prepared": 335}, "url_match": {"prepared": 205}}
    assert not any("__" in t.start_url for t in everything.tasks)
    # every site, no judge: the fuzzy_match tasks are refused, naming the field (docs/webarena.md's table)
    no_judge = load(path, Deployment.parse(ALL)).counts()
    assert (no_judge["prepared"], no_judge["refused"]) == (694, 118)
    assert {site: (row.get("prepared", 0), row.get("refused", 0)) for site, row in no_judge["by_site"].items()} == {
        "shopping": (158, 34), "shopping_admin": (158, 26), "reddit": (126, 3), "gitlab": (195, 9),
        "wikipedia": (21, 2), "map": (81, 47)}
    # the shop alone, no judge: the shopping tasks run but those a judge scores; each refusal names why
    shop = load(path, Deployment.parse([f"shopping={SHOP}"]))
    counts = shop.counts()
    assert counts["prepared"] + counts["refused"] == 812
    assert counts["by_site"]["shopping"] == {"prepared": 153, "refused": 39}
    assert all(r.reason.startswith("needs site ") or "fuzzy_match needs a judge model" in r.reason
               for r in shop.refused)
    assert sum("fuzzy_match" in r.reason for r in shop.refused) == 34
    assert all(t.start_url.startswith(SHOP) for t in shop.tasks)


def test_bunshin_webarena_tasks_prints_the_counts_and_refuses_a_bad_site(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from bunshin.engine.cli import main

    listing = tmp_path / "tasks.json"
    listing.write_text(json.dumps([task(task_id=1), task(task_id=2, sites=["map"])]))
    assert main(["webarena", "tasks", "--task-file", str(listing), "--site", f"shopping={SHOP}", "--refusals",
                 "--json", str(tmp_path / "counts.json")]) == 0
    out = capsys.readouterr().out
    assert f"{listing}: 1 tasks prepared, 1 refused (sites given: shopping={SHOP})" in out
    assert "| shopping | 1 | 0 |" in out and "| map | 0 | 1 |" in out
    assert f"REFUSED {listing}[1]: needs site map, not given" in out
    assert json.loads((tmp_path / "counts.json").read_text())["refused"] == 1
    with pytest.raises(SystemExit, match="bunshin webarena tasks: site shopping .* http:// or https://"):
        main(["webarena", "tasks", "--task-file", str(listing), "--site", "shopping=ftp://h"])


def test_the_stand_in_shop_signs_in_webarenas_account_and_refuses_a_wrong_password() -> None:
    """The embedded shop served outside any workspace stands in for a deployment's shopping site: its sign-in form
    is Magento's (the fields WebArena's set-up fills), and it takes WebArena's account only."""
    import http.cookiejar
    import urllib.parse
    import urllib.request

    from .shop_server import serve_shop

    def post(opener: urllib.request.OpenerDirector, url: str, user: str, password: str) -> tuple[str, str]:
        form = urllib.parse.urlencode({"login[username]": user, "login[password]": password}).encode()
        answer = opener.open(f"{url}/customer/account/loginPost/", form, timeout=10)
        return answer.url, answer.read().decode()

    with serve_shop() as shop:
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        page = browser.open(f"{shop.url}/customer/account/login/", timeout=10).read().decode()
        assert all(part in page for part in ('name="login[username]"', '<label for="email">Email</label>',
                                             '<label for="pass">Password</label>', "Sign In"))
        assert "signed in as" not in page
        url, page = post(browser, shop.url, "emma.lopez@gmail.com", "password.123")
        assert url.endswith("/customer/account/loginPost/") and "The account sign-in was incorrect" in page
        url, page = post(browser, shop.url, "Emma.Lopez@gmail.com", "Password.123")
        assert url == f"{shop.url}/customer/account/" and "My Account" in page
        page = browser.open(f"{shop.url}/customer/account/login/", timeout=10).read().decode()
        assert "You are signed in as emma.lopez@gmail.com." in page
        other = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        assert "signed in as" not in other.open(f"{shop.url}/customer/account/login/", timeout=10).read().decode()
