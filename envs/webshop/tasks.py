"""The web shop's tasks, generated from the catalog as WebArena task files (``config_files/<id>.json``).

Owns: the templates (retrieval, navigation, state-changing), their instantiation from a catalog of a given size and
seed, each task's reference action sequence in WebArena's action language, and writing/reading the files.
Every answer is computed from the same generator the shop serves from, so a task is right for its catalog; the
files for the default catalog are committed (``envs/webshop/tasks/``), others are generated once into a cache.
Must never: draw from anything but (catalog size, catalog seed): the same arguments give the same files.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import html as pages
from .catalog import Catalog, Product
from .search import SearchIndex
from .store import SHIPPING_PER_ITEM_CENTS, order_history

GENERATOR_VERSION = 2
DEFAULT_CATALOG_SIZE = 20_000
DEFAULT_CATALOG_SEED = 0
PER_TEMPLATE = 7
SEARCH_BOX = "@textbox 'Search entire store here...'"
COMMITTED = Path(__file__).resolve().parent / "tasks"

ADDRESSES = [
    ("Liam", "Nguyen", "55 Elm Street", "Portland", "Oregon", "97201", "United States", "5035550100"),
    ("Sophia", "Rossi", "12 Harbor Way", "Boston", "Massachusetts", "02110", "United States", "6175550199"),
    ("Noah", "Khan", "800 Lake Shore Dr", "Chicago", "Illinois", "60611", "United States", "3125550123"),
    ("Ava", "Tanaka", "4 Pine Court", "Austin", "Texas", "73301", "United States", "5125550142"),
    ("Lucas", "Silva", "230 Market St", "San Francisco", "California", "94105", "United States", "4155550177"),
    ("Mia", "Novak", "17 Birch Lane", "Denver", "Colorado", "80202", "United States", "3035550111"),
    ("Owen", "Larsen", "9 Ocean Ave", "Miami", "Florida", "33139", "United States", "3055550188"),
]
REVIEW_LINES = [
    ("Does the job", "Works well for everyday use, no complaints so far."),
    ("Too small", "Smaller than the pictures suggest, but well made."),
    ("Excellent", "One of the best purchases I have made this year."),
    ("Broke quickly", "It stopped working after two weeks of light use."),
    ("Good value", "Decent quality for the price and fast delivery."),
    ("Not as described", "The color is different from the product page."),
    ("Love it", "My whole family uses it every day."),
]


class Shop:
    """What the generator knows about a catalog: products, search, past orders (read once, then closed)."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        catalog = Catalog(size, seed)
        index = SearchIndex(catalog)
        try:
            self.products: list[Product] = list(catalog)
            names = [p.name for p in self.products]
            self.unique = {n for n in names if names.count(n) == 1} if size <= 2000 else _unique(names)
            self.findable = self._findable(index)
        finally:
            index.close()
            catalog.close()
        self.orders = order_history(size, self.products.__getitem__, seed)

    def _findable(self, index: SearchIndex) -> list[int]:
        """Products whose full name, searched for, comes first among the results, with a unique name."""
        found = []
        for doc in random.Random(f"findable:{self.seed}").sample(range(self.size), k=min(self.size, 400)):
            p = self.products[doc]
            hits = index.search(p.name, limit=1)
            if p.name in self.unique and hits and hits[0][0] == doc:
                found.append(doc)
        return found


def _unique(names: list[str]) -> set[str]:
    seen: dict[str, int] = {}
    for n in names:
        seen[n] = seen.get(n, 0) + 1
    return {n for n, c in seen.items() if c == 1}


Template = Callable[[Shop, random.Random, int], dict[str, Any]]


def _task(template: str, template_id: int, intent_template: str, values: dict[str, Any], evaluation: dict[str, Any],
          reference: list[str], start_url: str = "__SHOPPING__") -> dict[str, Any]:
    return {
        "sites": ["shopping"], "task_id": 0, "require_login": True,
        "storage_state": "./.auth/shopping_state.json", "start_url": start_url, "geolocation": None,
        "intent_template": intent_template, "instantiation_dict": values,
        "intent": intent_template.format(**values), "require_reset": evaluation["eval_types"] != ["string_match"],
        "eval": {"reference_url": "", "program_html": [], "url_note": "GOLD in PRED",
                 "string_note": "", "reference_answer_raw_annotation": "", **evaluation},
        "intent_template_id": template_id, "bunshin_template": template, "bunshin_reference": reference,
    }


def _find(name: str) -> list[str]:
    return [f"type [{SEARCH_BOX}] [{name}] [1]", f"click [@link '{name}']"]


def review_count(shop: Shop, rng: random.Random, i: int) -> dict[str, Any]:
    p = shop.products[rng.choice([d for d in shop.findable if shop.products[d].reviews])]
    n = len(p.reviews)
    return _task("review_count", 1, "How many reviews does {product} have?", {"product": p.name},
                 {"eval_types": ["string_match"], "reference_answers": {"must_include": [str(n)]},
                  "reference_answer_raw_annotation": str(n)}, [*_find(p.name), f"stop [{n}]"])


def product_attribute(shop: Shop, rng: random.Random, i: int) -> dict[str, Any]:
    p = shop.products[rng.choice(shop.findable)]
    attribute = ["color", "material"][i % 2]  # not the model: it is the last word of the name, in the question
    value = p.attributes[attribute]
    return _task("product_attribute", 2, "What is the {attribute} of {product}?",
                 {"attribute": attribute, "product": p.name},
                 {"eval_types": ["string_match"], "reference_answers": {"must_include": [value]},
                  "reference_answer_raw_annotation": value}, [*_find(p.name), f"stop [{value}]"])


def cheapest_in_category(shop: Shop, rng: random.Random, i: int) -> dict[str, Any]:
    category = shop.products[rng.randrange(shop.size)].category
    prices = [p.price_cents for p in shop.products if p.category == category]
    price = pages.money(min(prices))
    sub = category.split("/")[1]
    return _task("cheapest_in_category", 3, "What is the price of the cheapest product in the {category} category?",
                 {"category": sub},
                 {"eval_types": ["string_match"], "reference_answers": {"must_include": [price]},
                  "reference_answer_raw_annotation": price},
                 [f"click [@link '{sub}']", "click [@link 'Sort by Price ascending']", f"stop [{price}]"])


def order_total(shop: Shop, rng: random.Random, i: int) -> dict[str, Any]:
    order_id = rng.randint(1, len(shop.orders))
    _, _, items = shop.orders[order_id - 1]
    total = pages.money(sum(it.price_cents * it.qty for it in items) + SHIPPING_PER_ITEM_CENTS *
                        sum(it.qty for it in items))
    number = f"{order_id:09d}"
    return _task("order_total", 4, "What was the grand total of my order number {order}?", {"order": number},
                 {"eval_types": ["string_match"], "reference_answers": {"must_include": [total]},
                  "reference_answer_raw_annotation": total},
                 ["click [@link 'My Account']", "click [@link 'My Orders']", f"click [@link 'View Order {number}']",
                  f"stop [{total}]"])


def search_for(shop: Shop, rng: random.Random, i: int) -> dict[str, Any]:
    p = shop.products[rng.randrange(shop.size)]
    words = p.name.split()
    query = f"{words[1].lower()} {words[2].lower()}" if len(words) > 3 else p.name.lower()
    return _task("search_for", 5, "Search the store for {query}", {"query": query},
                 {"eval_types": ["url_match"],
                  "reference_url": f"__SHOPPING__/catalogsearch/result/?{urllib.parse.urlencode({'q': query})}"},
                 [f"type [{SEARCH_BOX}] [{query}] [1]", "stop []"])


def category_sorted(shop: Shop, rng: random.Random, i: int) -> dict[str, Any]:
    category = shop.products[rng.randrange(shop.size)].category
    sub = category.split("/")[1]
    key = ["price", "name", "rating"][i % 3]
    direction = rng.choice(["asc", "desc"])
    words = {"asc": "ascending", "desc": "descending"}[direction]
    query = urllib.parse.urlencode({"product_list_order": key, "product_list_dir": direction})
    return _task("category_sorted", 6, "Show me the {category} products sorted by {key} in {direction} order",
                 {"category": sub, "key": pages.SORT_KEYS[key].lower(), "direction": words},
                 {"eval_types": ["url_match"], "reference_url": f"__SHOPPING__{pages.category_url(category)}?{query}"},
                 [f"click [@link '{sub}']", f"click [@link 'Sort by {pages.SORT_KEYS[key]} {words}']", "stop []"])


def add_to_cart(shop: Shop, rng: random.Random, i: int) -> dict[str, Any]:
    p = shop.products[rng.choice(shop.findable)]
    qty = 1 + i % 3
    return _task("add_to_cart", 7, "Add {qty} of {product} to my cart", {"qty": qty, "product": p.name},
                 {"eval_types": ["program_html"], "program_html": [
                     {"url": "__SHOPPING__/checkout/cart/",
                      "locator": f"document.querySelector('tr[data-sku=\"{p.sku}\"] .col.qty').outerText",
                      "required_contents": {"exact_match": f"Qty: {qty}"}}]},
                 [*_find(p.name), f"type [@textbox 'Qty'] [{qty}] [0]", "click [@button 'Add to Cart']", "stop []"])


def checkout(shop: Shop, rng: random.Random, i: int) -> dict[str, Any]:
    ordered = {it.sku for _, _, items in shop.orders for it in items}  # a past order must not pass for this one
    p = shop.products[rng.choice([d for d in shop.findable if shop.products[d].sku not in ordered])]
    first, last, street, city, region, postcode, country, phone = ADDRESSES[i % len(ADDRESSES)]
    values = {"product": p.name, "name": f"{first} {last}", "street": street, "city": city, "region": region,
              "postcode": postcode, "country": country, "telephone": phone}
    fields = [("First Name", first), ("Last Name", last), ("Street Address", street), ("City", city),
              ("State/Province", region), ("Zip/Postal Code", postcode), ("Country", country),
              ("Phone Number", phone)]
    return _task("checkout", 8, "Buy {product} and ship it to {name}, {street}, {city}, {region} {postcode}, "
                                "{country} (phone {telephone})", values,
                 {"eval_types": ["program_html"], "program_html": [
                     {"url": "func:shopping_get_latest_order_url()",
                      "locator": "document.querySelector('.order-details-items.ordered').outerText",
                      "required_contents": {"must_include": [p.name]}},
                     {"url": "func:shopping_get_latest_order_url()",
                      "locator": "document.querySelector('.box-order-shipping-address').outerText",
                      "required_contents": {"must_include": [f"{first} {last}", street, city, region, postcode,
                                                             country, phone]}}]},
                 [*_find(p.name), "click [@button 'Add to Cart']", "click [@link 'Proceed to Checkout']",
                  *(f"type [@textbox '{label}'] [{value}] [0]" for label, value in fields),
                  "click [@button 'Place Order']", "stop []"])


def write_review(shop: Shop, rng: random.Random, i: int) -> dict[str, Any]:
    p = shop.products[rng.choice(shop.findable)]
    rating = 1 + (i * 2) % 5
    title, detail = REVIEW_LINES[i % len(REVIEW_LINES)]
    nickname = f"{rng.choice(['sam', 'alex', 'kim', 'jo', 'max'])}{rng.randint(10, 99)}"
    return _task("write_review", 9, "Write a {rating}-star review of {product} as {nickname} with the summary "
                                    "\"{title}\" and the text \"{detail}\"",
                 {"rating": rating, "product": p.name, "nickname": nickname, "title": title, "detail": detail},
                 {"eval_types": ["program_html"], "program_html": [
                     {"url": "last", "locator": f"func:shopping_get_sku_latest_review_rating('{p.sku}')",
                      "required_contents": {"exact_match": str(rating * 20)}},
                     {"url": "last", "locator": f"func:shopping_get_sku_latest_review_author('{p.sku}')",
                      "required_contents": {"exact_match": nickname}}]},
                 [*_find(p.name), f"type [@textbox 'Your Rating (1-5)'] [{rating}] [0]",
                  f"type [@textbox 'Nickname'] [{nickname}] [0]", f"type [@textbox 'Summary'] [{title}] [0]",
                  f"type [@textbox 'Review'] [{detail}] [0]", "click [@button 'Submit Review']", "stop []"])


def unachievable(shop: Shop, rng: random.Random, i: int) -> dict[str, Any]:
    p = shop.products[rng.randrange(shop.size)]
    for _ in range(100):  # the product's line with a model number that does not exist (the catalog's are < 1000)
        name = f"{p.name.rsplit(' ', 1)[0]} Z{rng.randint(1000, 9999)}"
        if name not in shop.unique:
            break
    return _task("unachievable", 10, "What is the price of the {product}?", {"product": name},
                 {"eval_types": ["string_match"], "reference_answers": {"fuzzy_match": "N/A"},
                  "reference_answer_raw_annotation": "N/A", "string_note": "the product does not exist"},
                 [f"type [{SEARCH_BOX}] [{name}] [1]", "stop [N/A]"])


TEMPLATES: dict[str, Template] = {t.__name__: t for t in (
    review_count, product_attribute, cheapest_in_category, order_total, search_for, category_sorted, add_to_cart,
    checkout, write_review, unachievable)}


def generate(size: int = DEFAULT_CATALOG_SIZE, seed: int = DEFAULT_CATALOG_SEED) -> list[dict[str, Any]]:
    """Every task for the catalog (size, seed), numbered from 0."""
    shop = Shop(size, seed)
    rng = random.Random(f"tasks:{size}:{seed}")
    tasks = []
    for template in TEMPLATES.values():
        for i in range(PER_TEMPLATE):
            task = template(shop, rng, i)
            task["task_id"] = len(tasks)
            tasks.append(task)
    return tasks


def write(directory: Path, tasks: list[dict[str, Any]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        (directory / f"{task['task_id']}.json").write_text(json.dumps(task, indent=2) + "\n")


def task_files(size: int = DEFAULT_CATALOG_SIZE, seed: int = DEFAULT_CATALOG_SEED) -> list[Path]:
    """The task files for a catalog: the committed ones for the default, else generated once into a cache."""
    if (size, seed) == (DEFAULT_CATALOG_SIZE, DEFAULT_CATALOG_SEED):
        directory = COMMITTED
    else:
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bunshin" / "webshop-tasks"
        directory = cache / f"v{GENERATOR_VERSION}-{size}-{seed}"
        if not directory.exists():
            cache.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=cache, prefix=".staging-"))
            try:
                write(staging, generate(size, seed))
                staging.rename(directory)  # atomic: a concurrent run sees all files or none
            except OSError:
                if not directory.exists():
                    raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return sorted(directory.glob("*.json"), key=lambda p: int(p.stem))

