"""The grounded agent for the web shop: WebArena's action language, decided from the instruction and the pages.

Owns: reading the instruction into a goal (the questions and errands a shopper asks of a store: a product's
reviews, attribute or price; the cheapest of a category; an order's total; a search; a sorted category; adding to
the cart; buying and shipping; writing a review) and, for each goal, the next action given the page the agent is
on. What it knows is what a prompt would tell a model about a shopping site: a search box in the header, category
links on the home page, "Sort by" links on a category page, "My Account" -> "My Orders" -> "View Order", a product
page with its price, its reviews link, its attribute table, a Qty field and "Add to Cart", a review form, a cart
with "Proceed to Checkout", a checkout form whose fields are labelled, and ``stop [N/A]`` when the thing asked for
does not exist. Every answer is read off a page: the reviews count, the attribute's cell, the first price of a list
sorted by price, the grand total of an order.
Must never: read the task's reference solution, its evaluator, the catalog or the shop's code; per-rollout memory
lives in ``ctx.extra`` under ``grounded_`` keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from bunshin.policies.base import PolicyContext

from .webshop_page import MONEY, Node, Page, name_is, visit

GIVE_UP = "stop [N/A]"
_PATTERNS = [  # (goal kind, instruction pattern); the first that matches wins
    ("reviews", r"how many reviews does (?:the )?(?P<product>.+?) have\??$"),
    ("cheapest", r"price of the cheapest (?:product|item) in the (?P<category>.+?) category\??$"),
    ("order_total", r"(?:grand )?total of my order (?:number |no\.? |#\s*)?(?P<order>\d+)\??$"),
    ("search", r"^search (?:the store |the site )?for (?P<query>.+?)\.?$"),
    ("sorted", r"^show me the (?P<category>.+?) products sorted by (?P<key>.+?) in (?P<direction>ascending|"
               r"descending) order\.?$"),
    ("cart", r"^add (?P<qty>\d+) (?:of |x )?(?:the )?(?P<product>.+?) to my cart\.?$"),
    ("buy", r"^buy (?:the )?(?P<product>.+?) and ship it to (?P<address>.+?),? \(phone (?P<phone>[\d +()-]+)\)\.?$"),
    ("review", r"^write an? (?P<rating>\d)-star review of (?:the )?(?P<product>.+?) as (?P<nickname>\S+) with the "
               r"summary \"(?P<title>[^\"]*)\" and the text \"(?P<detail>[^\"]*)\"\.?$"),
    ("attribute", r"^what is the (?P<attribute>[\w ]+?) of (?:the )?(?P<product>.+?)\??$"),
]
# Checkout and review form fields by label keyword, in the order they are tried (a label is matched once).
_ADDRESS_FIELDS = [("first", "first"), ("last", "last"), ("street", "street"), ("city", "city"),
                   ("state", "region"), ("province", "region"), ("region", "region"), ("zip", "postcode"),
                   ("postal", "postcode"), ("country", "country"), ("phone", "phone"), ("telephone", "phone"),
                   ("address", "street")]
_REVIEW_FIELDS = [("rating", "rating"), ("nickname", "nickname"), ("summary", "title"), ("title", "title"),
                  ("review", "detail")]


@dataclass(frozen=True)
class Goal:
    kind: str
    values: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, key: str) -> str:
        return self.values.get(key, "")


def read_goal(instruction: str) -> Goal | None:
    text = " ".join(instruction.split())
    for kind, pattern in _PATTERNS:
        if match := re.search(pattern, text, re.IGNORECASE):
            values = {k: v.strip() for k, v in match.groupdict().items()}
            if kind == "attribute" and values["attribute"].lower() == "price":
                kind = "price"
            if kind == "buy":
                values.update(_address(values.pop("address")))
            return Goal(kind, values)
    return None


def _address(text: str) -> dict[str, str]:
    """``First Last, street, city, region postcode, country`` as the checkout form's fields."""
    parts = [p.strip() for p in text.split(",")]
    name = parts[0].split(" ", 1) if parts else [""]
    out = {"first": name[0], "last": name[1] if len(name) > 1 else ""}
    rest = parts[1:]
    if len(rest) >= 4:
        out["street"], out["city"], out["country"] = rest[0], rest[1], rest[-1]
        region = rest[2].rsplit(" ", 1)
        out["region"], out["postcode"] = (region[0], region[1]) if len(region) == 2 else (region[0], "")
    return out


def act(ctx: PolicyContext) -> str:
    goal = read_goal(ctx.instruction)
    page = visit(ctx.observations, ctx.actions)
    if goal is None or page is None:
        return GIVE_UP
    step = _STEPS[goal.kind]
    return step(goal, page, ctx)


# -- moving about the shop --------------------------------------------------------------------------------------


def _click(found: Node | str | None) -> str | None:
    if isinstance(found, Node):
        return f"click [{found.id}]"
    return found


def _search(page: Page, query: str) -> str:
    """Type ``query`` into the header's search box and submit it."""
    box = page.seek(lambda n: n.role in ("textbox", "searchbox") and "search" in n.name.casefold())
    if isinstance(box, Node):
        return f"type [{box.id}] [{query}] [1]"
    return box or _home(page)


def _home(page: Page) -> str:
    """Back to the home page: a "Home" link, else the store's logo (the header's first link that is not the
    account's or the cart's), else the site's root."""
    header = [n for n in page.nodes if n.role == "link" and n.depth == 1]
    home = page.find(lambda n: n.role == "link" and n.name.casefold() in ("home", "home page")) or next(
        (n for n in header if n.name and not n.name.startswith("My ")), None)
    return _click(home) or "goto [/]"


def _results_for(page: Page) -> str | None:
    match = re.fullmatch(r"Search results for: '(.*)'", page.title)
    return match.group(1) if match else None


def _open_product(goal: Goal, page: Page) -> str:
    """From anywhere to the product's page: search for its name, open the result with exactly that name. None of
    the results on the first page being it means the store does not have it: give up."""
    product = goal["product"]
    if page.title.casefold() == product.casefold() and (more := page.scroll_for_more()):
        return more  # its page, whose "Add to Cart" this visit has not shown yet (a tall picture above it)
    query = _results_for(page)
    if query is None or query.casefold() != product.casefold():
        return _search(page, product)
    if page.find(lambda n: n.role == "StaticText" and "returned no results" in n.name):
        return GIVE_UP
    return _click(page.seek(name_is("link", product))) or GIVE_UP


def _on_product(goal: Goal, page: Page) -> bool:
    return page.title.casefold() == goal["product"].casefold() and page.find(
        lambda n: n.role == "button" and n.name.casefold() == "add to cart") is not None


def _main_part(page: Page) -> list[Node]:
    """A product page's own part: after its heading, before the lists of other products."""
    heading = page.find(lambda n: n.role == "heading" and n.name.casefold() == page.title.casefold())
    nodes = page.after(heading)
    end = next((i for i, n in enumerate(nodes) if n.name in ("Related Products", "Customer Reviews")), len(nodes))
    return nodes[:end]


def _answer(text: str) -> str:
    return f"stop [{text}]"


# -- questions ----------------------------------------------------------------------------------------------------


def _reviews(goal: Goal, page: Page, ctx: PolicyContext) -> str:
    if not _on_product(goal, page):
        return _open_product(goal, page)
    for node in _main_part(page):
        if match := re.fullmatch(r"(\d+) Reviews?", node.name):
            return _answer(match.group(1))
        if re.fullmatch(r"(?:no|be the first to) review.*", node.name, re.IGNORECASE):
            return _answer("0")
    return page.scroll_for_more() or GIVE_UP


def _price(goal: Goal, page: Page, ctx: PolicyContext) -> str:
    if not _on_product(goal, page):
        return _open_product(goal, page)
    price = next((n.name for n in _main_part(page) if n.role == "StaticText" and MONEY.fullmatch(n.name)), None)
    return _answer(price) if price else page.scroll_for_more() or GIVE_UP


def _attribute(goal: Goal, page: Page, ctx: PolicyContext) -> str:
    if not _on_product(goal, page):
        return _open_product(goal, page)
    header = page.find(lambda n: n.role == "rowheader" and n.name.casefold() == goal["attribute"].casefold())
    cell = next((n for n in page.after(header) if n.role == "cell"), None) if header else None
    if cell is not None:
        return _answer(cell.name)
    return page.scroll_for_more() or GIVE_UP


def _category(goal: Goal, page: Page) -> str | None:
    """None when ``page`` is the goal's category listing; else the action that goes there."""
    category = goal["category"]
    if page.title.casefold() == category.casefold() and page.find(_sort_link) is not None:
        return None
    link = page.find(name_is("link", category))
    if link is not None:
        return _click(link)
    if page.title == "Home Page":
        return page.scroll_for_more() or GIVE_UP  # the home page lists every category
    return _home(page)


def _sort_link(node: Node) -> bool:
    return node.role == "link" and node.name.casefold().startswith("sort by ")


def _sorted_by(page: Page) -> str:
    """'price (ascending)': what the listing says it is sorted by."""
    node = page.find(lambda n: n.role == "StaticText" and n.name.startswith("Sorted by "))
    return node.name.removeprefix("Sorted by ").casefold() if node else ""


def _sort(page: Page, key: str, direction: str) -> str | None:
    """None when the listing is sorted by ``key`` in ``direction``; else the click that sorts it."""
    key = {"name": "product name"}.get(key.casefold(), key.casefold())
    if _sorted_by(page) == f"{key} ({direction.casefold()})":
        return None
    return _click(page.seek(name_is("link", f"Sort by {key} {direction}"))) or GIVE_UP


def _cheapest(goal: Goal, page: Page, ctx: PolicyContext) -> str:
    if (move := _category(goal, page)) is not None:
        return move
    if (move := _sort(page, "price", "ascending")) is not None:
        return move
    sorted_line = page.find(lambda n: n.name.startswith("Sorted by "))
    price = next((n.name for n in page.after(sorted_line) if n.role == "StaticText" and MONEY.fullmatch(n.name)),
                 None)
    return _answer(price) if price else page.scroll_for_more() or GIVE_UP


def _order_total(goal: Goal, page: Page, ctx: PolicyContext) -> str:
    number = int(goal["order"])
    title = re.fullmatch(r"Order # ?(\d+)", page.title)
    if title and int(title.group(1)) == number:
        text = " ".join(n.name for n in page.nodes)
        if match := re.search(r"Grand Total:?\s*(" + MONEY.pattern + ")", text):
            return _answer(match.group(1))
        return page.scroll_for_more() or GIVE_UP

    def view_link(n: Node) -> bool:
        match = re.fullmatch(r"View Order #? ?(\d+)", n.name)
        return n.role == "link" and match is not None and int(match.group(1)) == number

    if (link := page.find(view_link)) is not None:
        return _click(link)
    if page.title == "My Orders":
        return _click(page.seek(view_link)) or _click(page.find(name_is("link", "Next"))) or GIVE_UP
    if page.title == "My Account":
        return _click(page.seek(name_is("link", "My Orders"))) or GIVE_UP
    return _click(page.seek(name_is("link", "My Account"))) or _home(page)


# -- errands ------------------------------------------------------------------------------------------------------


def _search_for(goal: Goal, page: Page, ctx: PolicyContext) -> str:
    query = _results_for(page)
    if query is not None and query.casefold() == goal["query"].casefold():
        return "stop []"
    return _search(page, goal["query"])


def _sorted(goal: Goal, page: Page, ctx: PolicyContext) -> str:
    if (move := _category(goal, page)) is not None:
        return move
    return _sort(page, goal["key"], goal["direction"]) or "stop []"


def _label(page: Page, box: Node) -> str:
    """A field's label: the text just before it (its name is its value once something is typed)."""
    nodes = page.nodes
    at = next(i for i, n in enumerate(nodes) if n.id == box.id)
    before = nodes[at - 1] if at else None
    return before.name if before is not None and before.role in ("StaticText", "LabelText") else box.name


def _field(page: Page, box: Node, keys: list[tuple[str, str]]) -> str | None:
    """Which of the goal's values the field ``box`` asks for, by the first keyword its label contains."""
    label = _label(page, box).casefold()
    return next((key for word, key in keys if word in label), None)


def _fill(page: Page, keys: list[tuple[str, str]], values: dict[str, str]) -> str | None:
    """Type the next labelled field whose value is not yet what ``values`` says; None when all are."""
    for box in (n for n in page.nodes if n.role == "textbox"):
        key = _field(page, box, keys)
        if key is not None and key in values and page.value(box) != values[key]:
            return f"type [{box.id}] [{values[key]}] [0]"
    return None


def _in_cart(page: Page, product: str) -> bool:
    """Whether ``page`` is the cart and has a row for ``product``."""
    name = product.casefold()
    return page.title == "Shopping Cart" and page.find(  # a row named by its cells (the text browser's tree), or
        lambda n: (n.role == "row" and n.name.casefold().startswith(name))  # the product's link in a nameless one
        or (n.role == "link" and n.name.casefold() == name)) is not None


def _cart(goal: Goal, page: Page, ctx: PolicyContext) -> str:
    qty = int(goal["qty"])
    if _in_cart(page, goal["product"]):
        return "stop []"
    if not _on_product(goal, page):
        return _open_product(goal, page)
    label = page.find(lambda n: n.role == "StaticText" and n.name.casefold() in ("qty", "quantity"))
    box = next((n for n in page.after(label) if n.role == "textbox"), None) if label else None
    if box is None:
        return page.scroll_for_more() or GIVE_UP
    if page.value(box) != str(qty):
        return f"type [{box.id}] [{qty}] [0]"
    return _click(page.seek(name_is("button", "Add to Cart"))) or GIVE_UP


def _buy(goal: Goal, page: Page, ctx: PolicyContext) -> str:
    if page.find(lambda n: "thank you for your purchase" in n.name.casefold() or n.name == "Your order number is:"):
        return "stop []"
    if page.title == "Checkout":
        values = {**goal.values, "phone": goal["phone"].strip()}
        if (move := _fill(page, _ADDRESS_FIELDS, values)) is not None:
            return move
        return page.scroll_for_more() or _click(page.find(name_is("button", "Place Order"))) or GIVE_UP
    if _in_cart(page, goal["product"]):
        return _click(page.seek(name_is("link", "Proceed to Checkout"))) or GIVE_UP
    if not _on_product(goal, page):
        return _open_product(goal, page)
    return _click(page.seek(name_is("button", "Add to Cart"))) or GIVE_UP


def _review(goal: Goal, page: Page, ctx: PolicyContext) -> str:
    if ctx.extra.get("grounded_review_submitted") and page.latest.error is None:
        return "stop []"  # the form was sent and the shop took it
    if not _on_product(goal, page):
        return _open_product(goal, page)
    if (move := _fill(page, _REVIEW_FIELDS, goal.values)) is not None:
        return move
    present = {_field(page, box, _REVIEW_FIELDS) for box in page.nodes if box.role == "textbox"}
    button = page.find(lambda n: n.role == "button" and "review" in n.name.casefold())
    if not present >= {"rating", "nickname", "title", "detail"} or button is None:
        return page.scroll_for_more() or GIVE_UP  # the form is further down, or there is none
    ctx.extra["grounded_review_submitted"] = True
    return f"click [{button.id}]"


_STEPS = {"reviews": _reviews, "price": _price, "attribute": _attribute, "cheapest": _cheapest,
          "order_total": _order_total, "search": _search_for, "sorted": _sorted, "cart": _cart, "buy": _buy,
          "review": _review}
