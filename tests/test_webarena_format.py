"""WebArena task files and the evaluators that need no browser (string_match, url_match)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bunshin.envs.suites import webarena as wa

REAL_SHAPED = {  # a task file as the real benchmark writes them, unused fields included
    "sites": ["shopping"], "task_id": 21, "require_login": True,
    "storage_state": "./.auth/shopping_state.json", "start_url": "__SHOPPING__", "geolocation": None,
    "intent_template": "List out reviewers, if exist, who mention about {{description}}",
    "instantiation_dict": {"description": "ear cups being small"},
    "intent": "List out reviewers, if exist, who mention about ear cups being small",
    "require_reset": False,
    "eval": {"eval_types": ["string_match"],
             "reference_answers": {"must_include": ["Joseph Brzezinski", "Catso"]},
             "reference_url": "", "program_html": [], "string_note": "",
             "reference_answer_raw_annotation": "Joseph Brzezinski, Catso"},
    "intent_template_id": 222,
}


def write(tmp_path: Path, data: dict, name: str = "21.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_real_shaped_file_loads(tmp_path: Path) -> None:
    task = wa.load_task(write(tmp_path, REAL_SHAPED))
    assert task.task_id == 21 and task.eval.reference_answers == {"must_include": ["Joseph Brzezinski", "Catso"]}
    assert task.instantiation_dict == {"description": "ear cups being small"}


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("intent"), "missing required field `intent`"),
    (lambda d: d["eval"].pop("eval_types"), "missing required field `eval_types`"),
    (lambda d: d.__setitem__("task_id", "x"), "`$.task_id`"),
    (lambda d: d.__setitem__("sites", ["gitlab"]), "sites ['gitlab'] are not in the embedded suite"),
    (lambda d: d["eval"].__setitem__("eval_types", ["string_match", "page_image_query"]),
     "eval.eval_types ['page_image_query'] are not supported"),
    (lambda d: d["eval"].__setitem__("reference_answers", {"ua_match": "x"}),
     "eval.reference_answers has ['ua_match'], not supported"),
    (lambda d: d["eval"].__setitem__("eval_types", ["url_match"]), "eval.reference_url is required"),
    (lambda d: d["eval"].__setitem__("eval_types", ["program_html"]), "eval.program_html is required"),
])
def test_bad_files_are_refused_naming_file_and_field(tmp_path: Path, mutate, message: str) -> None:
    data = json.loads(json.dumps(REAL_SHAPED))
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(wa.TaskFileError) as info:
        wa.load_task(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_not_json_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(wa.TaskFileError, match="bad.json: not JSON"):
        wa.load_task(tmp_path / "bad.json")
    with pytest.raises(wa.TaskFileError, match="nope.json: cannot read"):
        wa.load_task(tmp_path / "nope.json")


def test_string_match_semantics() -> None:
    ref = {"must_include": ["Joseph Brzezinski", "Catso"]}
    assert wa.string_match("Joseph Brzezinski and catso", ref, "") == 1.0
    assert wa.string_match("Joseph Brzezinski", ref, "") == 0.0
    assert wa.string_match('"Quest Lumaflex Band"', {"exact_match": "quest lumaflex band"}, "") == 1.0
    assert wa.string_match("Quest Lumaflex Band!", {"exact_match": "Quest Lumaflex Band"}, "") == 0.0
    # a single one-word reference must be a whole token
    assert wa.string_match("10", {"must_include": ["1"]}, "") == 0.0
    assert wa.string_match("there is 1 review", {"must_include": ["1"]}, "") == 1.0
    # unachievable tasks: the answer must be N/A
    assert wa.string_match("N/A", {"fuzzy_match": "N/A"}, "") == 1.0
    assert wa.string_match("", {"fuzzy_match": "N/A"}, "") == 0.0


def test_fuzzy_match_uses_the_judge_and_the_default_is_deterministic() -> None:
    ref = {"fuzzy_match": ["the price is 25.99 dollars"]}
    assert wa.string_match("It costs 25.99 dollars; that is the price", ref, "how much") == 1.0
    assert wa.string_match("It costs 26 dollars", ref, "how much") == 0.0
    seen = []
    judge = lambda intent, r, p: seen.append((intent, r, p)) or 0.5  # noqa: E731
    assert wa.string_match("x", ref, "how much", judge=judge) == 0.5
    assert seen == [("how much", "the price is 25.99 dollars", "x")]


@pytest.mark.parametrize("ref, page, score", [
    ("__SHOPPING__/catalogsearch/result/?q=headphones", "http://shop/catalogsearch/result/?q=headphones&p=2", 1.0),
    ("__SHOPPING__/catalogsearch/result/?q=headphones", "http://shop/catalogsearch/result/?q=speakers", 0.0),
    ("__SHOPPING__/electronics.html |OR| __SHOPPING__/computers.html", "http://shop/computers.html/", 1.0),
    ("__SHOPPING__/electronics.html", "http://shop/home", 0.0),
])
def test_url_match(ref: str, page: str, score: float) -> None:
    assert wa.url_match(wa.expand_url(ref, "http://shop/"), page) == score


def test_an_unachievable_answer_may_give_its_reason() -> None:
    note = "the product does not exist"
    intent = "What is the price of the Acme Tent Z1234?"
    assert wa.string_match("N/A", {"fuzzy_match": "N/A"}, intent, string_note=note) == 1.0
    assert wa.string_match("The product does not exist.", {"fuzzy_match": "N/A"}, intent, string_note=note) == 1.0
    assert wa.string_match("", {"fuzzy_match": "N/A"}, intent, string_note=note) == 0.0
    assert wa.string_match("$12.99", {"fuzzy_match": "N/A"}, intent, string_note=note) == 0.0


def test_program_html_last_reads_the_page_the_evaluator_went_to_last() -> None:
    targets = [wa.ProgramHtml(url="__SHOPPING__/checkout/cart/", locator="", required_contents={"must_include": ["A"]}),
               wa.ProgramHtml(url="last", locator="document.querySelector('.x').outerText",
                              required_contents={"exact_match": "B"})]
    reads = []

    def read(url, selector):
        reads.append((url, selector))
        return {"": "A cart", ".x": "B"}[selector]

    assert wa.program_html(targets, "http://shop", read, lambda path: {}) == 1.0
    assert reads == [("http://shop/checkout/cart/", ""), ("http://shop/checkout/cart/", ".x")]
    assert wa.target_urls([targets[1]], "http://shop") == [None]  # a leading "last": the agent's page


@pytest.mark.parametrize("contents, message", [
    ({"must_include": "Sony"}, "must_include must be a list of strings"),
    ({"exact_match": ["x"]}, "exact_match must be a string"),
])
def test_program_html_contents_of_the_wrong_type_are_refused(tmp_path: Path, contents, message) -> None:
    data = json.loads(json.dumps(REAL_SHAPED))
    data["eval"] = {"eval_types": ["program_html"], "reference_answers": None, "reference_url": "",
                    "program_html": [{"url": "last", "locator": "", "required_contents": contents}]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    with pytest.raises(wa.TaskFileError, match=message):
        wa.load_task(path)
    data["eval"]["program_html"][0].update(required_contents={"must_include": ["x"]},
                                           prep_actions=["document.querySelector('button').click()"])
    path.write_text(json.dumps(data))
    with pytest.raises(wa.TaskFileError, match="prep_actions"):
        wa.load_task(path)
