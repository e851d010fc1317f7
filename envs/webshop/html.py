"""The shop's pages as HTML, shaped after Magento's Luma theme (the software behind WebArena's shopping site), so
that WebArena-style locators and the text browser find what they expect: ``.page-title``, ``.product-item-link``,
``.price``, ``.review-item`` and friends.

Owns: rendering only; every value is escaped. Must never: read the shop's state itself (callers pass it in).
"""

from __future__ import annotations

import html
import re
import urllib.parse
from typing import Any

from .catalog import Product


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def category_url(category: str) -> str:
    return "/" + "/".join(slug(part) for part in category.split("/")) + ".html"


def _page(title: str, body: str) -> str:
    e = html.escape
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{e(title)}</title></head><body>"
            f"<header class=\"page-header\"><a class=\"logo\" href=\"/\">One Stop Market</a>"
            f"<form class=\"form minisearch\" action=\"/catalogsearch/result/\" method=\"get\">"
            f"<input id=\"search\" type=\"text\" name=\"q\" placeholder=\"Search entire store here...\">"
            f"<button type=\"submit\" class=\"action search\">Search</button></form></header>"
            f"<main id=\"maincontent\" class=\"page-main\"><h1 class=\"page-title\"><span class=\"base\">{e(title)}"
            f"</span></h1>{body}</main></body></html>")


def _items(products: list[Any]) -> str:  # products with a .url
    e = html.escape
    rows = "".join(
        f"<li class=\"item product product-item\"><a class=\"product-item-link\" href=\"{p.url}\">"
        f"{e(p.name)}</a><span class=\"price\">{p.price}</span><div class=\"rating-summary\">"
        f"<span class=\"rating-result\">{p.rating}</span><a class=\"action view\">{len(p.reviews)} Reviews</a>"
        f"</div></li>" for p in products)
    return f"<ol class=\"products list items product-items\">{rows}</ol>"


def home(categories: list[str]) -> str:
    links = "".join(f"<li class=\"category-item\"><a href=\"{category_url(c)}\">{html.escape(c.split('/')[-1])}"
                    f"</a></li>" for c in categories)
    return _page("Home Page", f"<nav class=\"navigation\"><ul>{links}</ul></nav>")


def search_results(query: str, products: list[Any]) -> str:
    note = (f"<div class=\"search results\">{_items(products)}</div>" if products else
            "<div class=\"message notice\">Your search returned no results.</div>")
    return _page(f"Search results for: '{query}'", note)


def category(name: str, products: list[Any]) -> str:
    return _page(name.split("/")[-1], _items(products))


def product_page(p: Product) -> str:
    e = html.escape
    attributes = "".join(f"<tr><th class=\"col label\">{e(k.title())}</th><td class=\"col data\">{e(v)}</td></tr>"
                         for k, v in p.attributes.items())
    reviews = "".join(
        f"<li class=\"item review-item\"><div class=\"review-title\">{e(r.title)}</div>"
        f"<div class=\"review-ratings\"><span class=\"rating-result\">{r.rating}</span></div>"
        f"<div class=\"review-content\">{e(r.text)}</div><div class=\"review-details\">"
        f"<strong class=\"review-details-value\">{e(r.author)}</strong>"
        f"<time class=\"review-details-value\">{r.date}</time></div></li>" for r in p.reviews)
    body = (f"<div class=\"product-info-main\"><div class=\"product-info-price\"><span class=\"price\">{p.price}"
            f"</span></div><div class=\"product attribute sku\"><div class=\"value\">{e(p.sku)}</div></div>"
            f"<div class=\"product-reviews-summary\"><span class=\"rating-result\">{p.rating}</span>"
            f"<a class=\"action view\">{len(p.reviews)} Reviews</a></div>"
            f"<form class=\"product_addtocart_form\" action=\"/checkout/cart/add/\" method=\"post\">"
            f"<input type=\"hidden\" name=\"sku\" value=\"{e(p.sku)}\"><input name=\"qty\" value=\"1\">"
            f"<button type=\"submit\" class=\"action tocart primary\">Add to Cart</button></form></div>"
            f"<div class=\"product attribute description\">{e(p.description)}</div>"
            f"<table class=\"data table additional-attributes\">{attributes}</table>"
            f"<div id=\"product-review-container\"><ol class=\"items review-items\">{reviews}</ol></div>")
    return _page(p.name, body)


def cart(rows: list[tuple[Any, int]]) -> str:
    """``rows``: (product with .url, quantity)."""
    e = html.escape
    if not rows:
        return _page("Shopping Cart", "<div class=\"cart-empty\">You have no items in your shopping cart.</div>")
    items = "".join(
        f"<tr class=\"item-info\"><td class=\"col item\"><a class=\"product-item-link\" href=\"{p.url}\">"
        f"{e(p.name)}</a></td><td class=\"col price\"><span class=\"price\">{p.price}</span></td>"
        f"<td class=\"col qty\"><input class=\"input-text qty\" value=\"{qty}\"></td></tr>" for p, qty in rows)
    total = sum(p.price_cents * qty for p, qty in rows)
    subtotal = f"${total // 100}.{total % 100:02d}"
    return _page("Shopping Cart", f"<table id=\"shopping-cart-table\" class=\"cart items data table\">{items}"
                                  f"</table><div class=\"cart-totals\"><span class=\"price\">{subtotal}</span></div>")


def not_found(path: str) -> str:
    return _page("404 Not Found", f"<p>The page you requested was not found: {html.escape(path)}</p>")


def query_of(path: str) -> tuple[str, dict[str, list[str]]]:
    parsed = urllib.parse.urlparse(path)
    return parsed.path, urllib.parse.parse_qs(parsed.query)
