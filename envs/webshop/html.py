"""The shop's pages as HTML, shaped after Magento's Luma theme (the software behind WebArena's shopping site), so
that WebArena-style locators and the text browser find what they expect: ``.page-title``, ``.product-item-link``,
``.price``, ``.review-item``, ``.order-details-items.ordered``, ``#shopping-cart-table`` and friends.

Owns: rendering only; every value is escaped. Must never: read the shop's state itself (callers pass it in).
"""

from __future__ import annotations

import html
import re
import urllib.parse
from typing import Any

from .catalog import Product
from .store import ADDRESS_FIELDS, CUSTOMER, SHIPPING_PER_ITEM_CENTS, CustomerReview, Order
from .style import STYLE

e = html.escape
ADDRESS_LABELS = {"firstname": "First Name", "lastname": "Last Name", "street": "Street Address", "city": "City",
                  "region": "State/Province", "postcode": "Zip/Postal Code", "country": "Country",
                  "telephone": "Phone Number"}
SORT_KEYS = {"position": "Position", "name": "Product Name", "price": "Price", "rating": "Rating"}


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def category_url(category: str) -> str:
    return "/" + "/".join(slug(part) for part in category.split("/")) + ".html"


def money(cents: int) -> str:
    return f"${cents // 100:,}.{cents % 100:02d}"


def image_url(sku: str) -> str:
    """Magento serves product images below /media/catalog/product/; sizes are set where they are shown (Luma's:
    240x300 in listings, 165x165 in the cart, 700x700 on the product page)."""
    return f"/media/catalog/product/{sku.lower()}.png"


def order_url(order_id: int) -> str:
    return f"/sales/order/view/order_id/{order_id}/"


def _page(title: str, body: str, message: str = "") -> str:
    notice = f"<div class=\"messages\"><div class=\"message\">{e(message)}</div></div>" if message else ""
    # the stylesheet closes the body: the text browser numbers every node of the document in order, so a
    # ``<style>`` before the content would renumber every element it shows (its observations would change)
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{e(title)}</title></head><body>"
            f"<header class=\"page-header\"><ul class=\"header links\">"
            f"<li><a href=\"/customer/account/\">My Account</a></li>"
            f"<li><a class=\"action showcart\" href=\"/checkout/cart/\">My Cart</a></li></ul>"
            f"<a class=\"logo\" href=\"/\">One Stop Market</a>"
            f"<form class=\"form minisearch\" action=\"/catalogsearch/result/\" method=\"get\">"
            f"<input id=\"search\" type=\"text\" name=\"q\" placeholder=\"Search entire store here...\">"
            f"<button type=\"submit\" class=\"action search\">Search</button></form></header>"
            f"<main id=\"maincontent\" class=\"page-main\"><h1 class=\"page-title\"><span class=\"base\">{e(title)}"
            f"</span></h1>{notice}{body}</main><style>{STYLE}</style></body></html>")


def _items(products: list[Any]) -> str:  # products with a .url
    rows = "".join(
        f"<li class=\"item product product-item\"><img class=\"product-image-photo\" src=\"{image_url(p.sku)}\" "
        f"width=\"240\" height=\"300\" alt=\"\"><a class=\"product-item-link\" href=\"{p.url}\">"
        f"{e(p.name)}</a><span class=\"price\">{p.price}</span><div class=\"rating-summary\">"
        f"<span class=\"rating-result\">Rating: {p.rating}</span><span class=\"reviews-actions\">"
        f"{len(p.reviews)} Reviews</span></div></li>" for p in products)
    return f"<ol class=\"products list items product-items\">{rows}</ol>"


def _pager(base: str, query: dict[str, str], page: int, pages: int) -> str:
    if pages <= 1:
        return ""
    links = []
    if page > 1:
        links.append(f"<a class=\"action previous\" href=\"{base}?{urllib.parse.urlencode({**query, 'p': page - 1})}\">"
                     f"Previous</a>")
    links.append(f"<span class=\"toolbar-number\">Page {page} of {pages}</span>")
    if page < pages:
        links.append(f"<a class=\"action next\" href=\"{base}?{urllib.parse.urlencode({**query, 'p': page + 1})}\">"
                     f"Next</a>")
    return f"<div class=\"pages\">{''.join(links)}</div>"


def home(categories: list[str]) -> str:
    links = "".join(f"<li class=\"category-item\"><a href=\"{category_url(c)}\">{e(c.split('/')[-1])}"
                    f"</a></li>" for c in categories)
    return _page("Home Page", f"<nav class=\"navigation\"><ul>{links}</ul></nav>")


def search_results(query: str, products: list[Any], total: int, page: int, pages: int) -> str:
    if not products:
        return _page(f"Search results for: '{query}'",
                     "<div class=\"message notice\">Your search returned no results.</div>")
    return _page(f"Search results for: '{query}'",
                 f"<p class=\"toolbar-amount\">{total} items</p><div class=\"search results\">{_items(products)}"
                 f"</div>{_pager('/catalogsearch/result/', {'q': query}, page, pages)}")


def category(name: str, url: str, products: list[Any], total: int, page: int, pages: int, order: str,
             direction: str) -> str:
    sorters = "".join(
        f"<a class=\"sorter-option\" href=\"{url}?{urllib.parse.urlencode({'product_list_order': key, 'product_list_dir': d})}\">"
        f"Sort by {label} {'ascending' if d == 'asc' else 'descending'}</a>"
        for key, label in SORT_KEYS.items() if key != "position" for d in ("asc", "desc"))
    toolbar = (f"<div class=\"toolbar toolbar-products\"><p class=\"toolbar-amount\">{total} items</p>"
               f"<div class=\"toolbar-sorter sorter\"><span class=\"sorter-label\">Sorted by "
               f"{SORT_KEYS[order]} ({'ascending' if direction == 'asc' else 'descending'})</span>{sorters}</div></div>")
    query = {"product_list_order": order, "product_list_dir": direction} if order != "position" else {}
    return _page(name.split("/")[-1], f"{toolbar}{_items(products)}{_pager(url, query, page, pages)}")


def product_page(p: Product, customer_reviews: list[CustomerReview], message: str = "",
                 related: list[Any] | None = None) -> str:
    attributes = "".join(f"<tr><th class=\"col label\">{e(k.title())}</th><td class=\"col data\">{e(v)}</td></tr>"
                         for k, v in p.attributes.items())
    mine = "".join(
        f"<li class=\"item review-item customer-review\"><div class=\"review-title\">{e(r.title)}</div>"
        f"<div class=\"review-ratings\"><span class=\"rating-result\">Rating: {r.rating}</span></div>"
        f"<div class=\"review-content\">{e(r.detail)}</div><div class=\"review-details\">Review by "
        f"<strong class=\"review-details-value\">{e(r.nickname)}</strong> "
        f"<time class=\"review-details-value\">{r.created}</time></div></li>" for r in customer_reviews)
    theirs = "".join(
        f"<li class=\"item review-item\"><div class=\"review-title\">{e(r.title)}</div>"
        f"<div class=\"review-ratings\"><span class=\"rating-result\">Rating: {r.rating}</span></div>"
        f"<div class=\"review-content\">{e(r.text)}</div><div class=\"review-details\">Review by "
        f"<strong class=\"review-details-value\">{e(r.author)}</strong> "
        f"<time class=\"review-details-value\">{r.date}</time></div></li>" for r in p.reviews)
    count = len(p.reviews) + len(customer_reviews)
    review_form = (
        f"<form class=\"review-form\" action=\"/review/product/post/id/{e(p.sku.lower())}/\" method=\"post\">"
        f"<fieldset class=\"fieldset review-fieldset\"><legend class=\"legend review-legend\">You're reviewing: "
        f"{e(p.name)}</legend><label for=\"rating\">Your Rating (1-5)</label>"
        f"<input id=\"rating\" name=\"rating\" type=\"text\" placeholder=\"Your Rating (1-5)\">"
        f"<label for=\"nickname\">Nickname</label><input id=\"nickname\" name=\"nickname\" type=\"text\" "
        f"placeholder=\"Nickname\"><label for=\"summary\">Summary</label><input id=\"summary\" name=\"title\" "
        f"type=\"text\" placeholder=\"Summary\"><label for=\"review\">Review</label>"
        f"<textarea id=\"review\" name=\"detail\" placeholder=\"Review\"></textarea></fieldset>"
        f"<button type=\"submit\" class=\"action submit primary\">Submit Review</button></form>")
    body = (f"<div class=\"product media\"><img class=\"gallery-placeholder\" src=\"{image_url(p.sku)}\" "
            f"width=\"700\" height=\"700\" alt=\"{e(p.name)}\">"
            f"</div><div class=\"product-info-main\"><div class=\"product-info-price\"><span class=\"price\">{p.price}"
            f"</span></div><div class=\"product attribute sku\"><strong class=\"type\">SKU</strong>"
            f"<div class=\"value\">{e(p.sku)}</div></div>"
            f"<div class=\"product-reviews-summary\"><span class=\"rating-result\">Rating: {p.rating}</span>"
            f"<a class=\"action view\" href=\"#reviews\">{count} Reviews</a></div>"
            f"<form class=\"product_addtocart_form\" action=\"/checkout/cart/add/\" method=\"post\">"
            f"<input type=\"hidden\" name=\"sku\" value=\"{e(p.sku)}\"><label for=\"qty\">Qty</label>"
            f"<input id=\"qty\" name=\"qty\" type=\"text\" value=\"1\" placeholder=\"Qty\">"
            f"<button type=\"submit\" class=\"action tocart primary\">Add to Cart</button></form></div>"
            f"<div class=\"product attribute description\">{e(p.description)}</div>"
            f"<table class=\"data table additional-attributes\">{attributes}</table>"
            f"<div id=\"reviews\" class=\"product-review-container\"><h2 class=\"block-title\">Customer Reviews</h2>"
            f"<ol class=\"items review-items\">{mine}{theirs}</ol>{review_form}</div>")
    if related:
        body += (f"<div class=\"block related\"><strong class=\"block-title\">Related Products</strong>"
                 f"{_items(related)}</div>")
    return _page(p.name, body, message)


def cart(rows: list[tuple[Any, int]], message: str = "") -> str:
    """``rows``: (product with .url, quantity)."""
    if not rows:
        return _page("Shopping Cart", "<div class=\"cart-empty\">You have no items in your shopping cart.</div>",
                     message)
    items = "".join(
        f"<tr class=\"item-info\" data-sku=\"{e(p.sku)}\"><td class=\"col item\"><img class=\"product-image-photo\" "
        f"src=\"{image_url(p.sku)}\" width=\"165\" height=\"165\" alt=\"\"><a class=\"product-item-link\" href=\"{p.url}\">"
        f"{e(p.name)}</a></td><td class=\"col price\"><span class=\"price\">{p.price}</span></td>"
        f"<td class=\"col qty\">Qty: {qty}</td><td class=\"col actions\">"
        f"<form action=\"/checkout/cart/delete/\" method=\"post\"><input type=\"hidden\" name=\"sku\" "
        f"value=\"{e(p.sku)}\"><button type=\"submit\" class=\"action action-delete\">Remove {e(p.name)}</button>"
        f"</form></td></tr>" for p, qty in rows)
    total = sum(p.price_cents * qty for p, qty in rows)
    return _page("Shopping Cart", f"<table id=\"shopping-cart-table\" class=\"cart items data table\">{items}"
                                  f"</table><div class=\"cart-totals\">Subtotal <span class=\"price\">{money(total)}"
                                  f"</span></div><a class=\"action primary checkout\" href=\"/checkout/\">"
                                  f"Proceed to Checkout</a>", message)


def checkout(rows: list[tuple[Any, int]], values: dict[str, str], errors: list[str]) -> str:
    if not rows:
        return _page("Checkout", "<div class=\"cart-empty\">You have no items in your shopping cart.</div>")
    fields = "".join(
        f"<div class=\"field _required\"><label for=\"{f}\">{ADDRESS_LABELS[f]}</label>"
        f"<input id=\"{f}\" name=\"{f}\" type=\"text\" value=\"{e(values.get(f, ''))}\" "
        f"placeholder=\"{ADDRESS_LABELS[f]}\">"
        + (f"<div class=\"field-error\">{ADDRESS_LABELS[f]}: This is a required field.</div>" if f in errors else "")
        + "</div>" for f in ADDRESS_FIELDS)
    count = sum(q for _, q in rows)
    subtotal = sum(p.price_cents * q for p, q in rows)
    summary = "".join(f"<li class=\"product-item\">{e(p.name)} x {q}</li>" for p, q in rows)
    body = (f"<div class=\"opc-block-summary\"><ol class=\"minicart-items\">{summary}</ol>"
            f"<div class=\"totals\">Cart Subtotal <span class=\"price\">{money(subtotal)}</span> Shipping (Flat Rate) "
            f"<span class=\"price\">{money(SHIPPING_PER_ITEM_CENTS * count)}</span></div></div>"
            f"<form class=\"form form-shipping-address\" action=\"/checkout/placeorder/\" method=\"post\">"
            f"<fieldset class=\"fieldset address\"><legend class=\"legend\">Shipping Address</legend>{fields}"
            f"</fieldset><button type=\"submit\" class=\"action primary checkout\">Place Order</button></form>")
    return _page("Checkout", body)


def order_success(order_id: int) -> str:
    return _page("Thank you for your purchase!",
                 f"<div class=\"checkout-success\"><p>Your order number is: <a class=\"order-number\" "
                 f"href=\"{order_url(order_id)}\"><strong>{order_id:09d}</strong></a>.</p><p>We'll email you an order "
                 f"confirmation with details and tracking info.</p></div>")


def _orders_table(orders: list[Order]) -> str:
    rows = "".join(
        f"<tr><td class=\"col id\">{o.number}</td><td class=\"col date\">{o.created}</td>"
        f"<td class=\"col shipping\">{e(o.address.firstname)} {e(o.address.lastname)}</td>"
        f"<td class=\"col total\"><span class=\"price\">{money(o.total_cents)}</span></td>"
        f"<td class=\"col status\">{o.status.title()}</td><td class=\"col actions\">"
        f"<a class=\"action view\" href=\"{order_url(o.id)}\">View Order {o.number}</a></td></tr>" for o in orders)
    return (f"<table class=\"data table table-order-items history\" id=\"my-orders-table\"><thead><tr>"
            f"<th>Order #</th><th>Date</th><th>Ship To</th><th>Order Total</th><th>Status</th><th>Action</th>"
            f"</tr></thead><tbody>{rows}</tbody></table>")


def account(orders: list[Order]) -> str:
    last = orders[0].address if orders else None
    address = "".join(f"{e(line)}<br>" for line in last.lines()) if last else "You have not set a default address."
    body = (f"<div class=\"block block-dashboard-info\"><strong class=\"block-title\">Contact Information</strong>"
            f"<div class=\"box-content\">{e(CUSTOMER['name'])}<br>{e(CUSTOMER['email'])}</div></div>"
            f"<div class=\"block block-dashboard-addresses\"><strong class=\"block-title\">Default Shipping Address"
            f"</strong><address>{address}</address></div>"
            f"<div class=\"block block-dashboard-orders\"><strong class=\"block-title\">Recent Orders</strong>"
            f"<a class=\"action view\" href=\"/sales/order/history/\">My Orders</a>{_orders_table(orders[:5])}</div>")
    return _page("My Account", body)


def login(message: str = "") -> str:
    """Magento's sign-in page (what WebArena's set-up fills: the fields labelled Email and Password, Sign In)."""
    body = ("<form class=\"form form-login\" action=\"/customer/account/loginPost/\" method=\"post\">"
            "<fieldset class=\"fieldset login\"><legend class=\"legend\">Registered Customers</legend>"
            "<label for=\"email\">Email</label><input id=\"email\" name=\"login[username]\" type=\"email\">"
            "<label for=\"pass\">Password</label><input id=\"pass\" name=\"login[password]\" type=\"password\">"
            "<button type=\"submit\" class=\"action login primary\">Sign In</button></fieldset></form>")
    return _page("Customer Login", body, message)


def order_history(orders: list[Order]) -> str:
    return _page("My Orders", _orders_table(orders) if orders else "<div class=\"message info empty\">You have "
                                                                    "placed no orders.</div>")


def order_view(o: Order) -> str:
    items = "".join(
        f"<tr><td class=\"col name\"><strong class=\"product name product-item-name\">{e(i.name)}</strong></td>"
        f"<td class=\"col sku\">{e(i.sku)}</td><td class=\"col price\"><span class=\"price\">{money(i.price_cents)}"
        f"</span></td><td class=\"col qty\">Ordered: {i.qty}</td><td class=\"col subtotal\"><span class=\"price\">"
        f"{money(i.price_cents * i.qty)}</span></td></tr>" for i in o.items)
    address = "".join(f"{e(line)}<br>" for line in o.address.lines())
    body = (f"<span class=\"order-status\">{o.status.title()}</span><div class=\"order-date\">Order Date: "
            f"{o.created}</div><div class=\"order-details-items ordered\"><table class=\"data table "
            f"table-order-items\"><thead><tr><th>Product Name</th><th>SKU</th><th>Price</th><th>Qty</th>"
            f"<th>Subtotal</th></tr></thead><tbody>{items}</tbody></table><div class=\"grand_totals\">Subtotal "
            f"{money(o.subtotal_cents)} Shipping {money(o.shipping_cents)} Grand Total <span class=\"price\">"
            f"{money(o.total_cents)}</span></div></div><div class=\"box box-order-shipping-address\">"
            f"<strong class=\"box-title\">Shipping Address</strong><address>{address}</address></div>")
    return _page(f"Order # {o.number}", body)


def not_found(path: str) -> str:
    return _page("404 Not Found", f"<p>The page you requested was not found: {e(path)}</p>")


def bad_request(message: str) -> str:
    return _page("Request Refused", f"<p class=\"message error\">{e(message)}</p>")


def query_of(path: str) -> tuple[str, dict[str, list[str]]]:
    parsed = urllib.parse.urlparse(path)
    return parsed.path, urllib.parse.parse_qs(parsed.query)
