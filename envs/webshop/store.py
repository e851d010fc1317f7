"""The shop's per-rollout state: sessions, carts, orders, addresses and customer reviews in SQLite, in the
workspace's own file system.

Owns: the schema, the customer's past orders seeded into a new database, and every query. The database file forks
with the workspace's files; the connection must not (an SQLite connection carried across fork() is undefined
behaviour), so ``reopen()`` runs in every clone, after ``flush()`` wrote everything in the source before the file
snapshot. There is one customer account (WebArena's shop is used logged in as one customer); carts belong to
browser sessions, orders and reviews to the account.
Must never: keep a transaction open across a request.
"""

from __future__ import annotations

import os
import random
import sqlite3
from collections.abc import Callable
from typing import Any

import msgspec

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS sign_ins (session TEXT PRIMARY KEY, email TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cart_items (session TEXT NOT NULL, sku TEXT NOT NULL, qty INTEGER NOT NULL,
                                       PRIMARY KEY (session, sku));
CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, created TEXT NOT NULL, status TEXT NOT NULL,
                                   firstname TEXT, lastname TEXT, street TEXT, city TEXT, region TEXT,
                                   postcode TEXT, country TEXT, telephone TEXT,
                                   subtotal_cents INTEGER NOT NULL, shipping_cents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS order_items (order_id INTEGER NOT NULL, sku TEXT NOT NULL, name TEXT NOT NULL,
                                        price_cents INTEGER NOT NULL, qty INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS reviews (id INTEGER PRIMARY KEY, sku TEXT NOT NULL, nickname TEXT NOT NULL,
                                    title TEXT NOT NULL, detail TEXT NOT NULL, rating INTEGER NOT NULL,
                                    created TEXT NOT NULL);
"""

CUSTOMER = {"name": "Emma Lopez", "email": "emma.lopez@gmail.com", "password": "Password.123"}  # WebArena's account
ADDRESS_FIELDS = ("firstname", "lastname", "street", "city", "region", "postcode", "country", "telephone")
SHIPPING_PER_ITEM_CENTS = 500  # Magento's flat rate: $5.00 per item
STORE_DATE = "2023-06-01"  # the shop's clock: fixed, so the same actions give the same pages on any day
PAST_ORDERS = 12


class Address(msgspec.Struct, frozen=True, kw_only=True):
    firstname: str
    lastname: str
    street: str
    city: str
    region: str
    postcode: str
    country: str
    telephone: str

    def lines(self) -> list[str]:
        return [f"{self.firstname} {self.lastname}", self.street, f"{self.city}, {self.region}, {self.postcode}",
                self.country, f"T: {self.telephone}"]


class OrderItem(msgspec.Struct, frozen=True, kw_only=True):
    sku: str
    name: str
    price_cents: int
    qty: int


class Order(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    created: str
    status: str
    address: Address
    items: list[OrderItem]
    subtotal_cents: int
    shipping_cents: int

    @property
    def number(self) -> str:
        return f"{self.id:09d}"

    @property
    def total_cents(self) -> int:
        return self.subtotal_cents + self.shipping_cents


class CustomerReview(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    sku: str
    nickname: str
    title: str
    detail: str
    rating: int
    created: str


PastOrder = tuple[str, str, list[OrderItem]]  # (date, status, items)


def order_history(n_products: int, product: Callable[[int], Any], seed: int) -> list[PastOrder]:
    """The customer's past orders in a new shop, deterministic in (catalog, seed); order ids are 1, 2, ... in this
    order. ``product(i)`` is the catalog's i-th product."""
    rng = random.Random(f"orders:{seed}")
    history = []
    for n in range(PAST_ORDERS):
        created = f"2022-{1 + n:02d}-{rng.randint(1, 28):02d}"
        status = rng.choices(["complete", "canceled", "pending"], weights=[8, 2, 1])[0]
        docs = rng.sample(range(n_products), k=min(rng.randint(1, 3), n_products))
        items = [OrderItem(sku=product(d).sku, name=product(d).name, price_cents=product(d).price_cents,
                           qty=rng.randint(1, 2)) for d in docs]
        history.append((created, status, items))
    return history


HOME_ADDRESS = Address(firstname="Emma", lastname="Lopez", street="101 S San Mateo Dr", city="San Mateo",
                       region="California", postcode="94010", country="United States", telephone="6505551212")


class Store:
    def __init__(self, path: str, history: list[PastOrder] | None = None):
        """A new database gets the customer's past orders, ``history`` (see ``order_history``)."""
        self.path = path
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        self.db = self._connect()
        self.db.executescript(SCHEMA)
        if history and self.db.execute("SELECT COUNT(*) FROM orders").fetchone()[0] == 0:
            for created, status, items in history:
                self._insert_order(created, status, HOME_ADDRESS, items)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, isolation_level=None)  # autocommit: no transaction outlives a call

    def _insert_order(self, created: str, status: str, address: Address, items: list[OrderItem]) -> int:
        subtotal = sum(i.price_cents * i.qty for i in items)
        shipping = SHIPPING_PER_ITEM_CENTS * sum(i.qty for i in items)
        self.db.execute("BEGIN")
        try:
            cur = self.db.execute(
                "INSERT INTO orders (created, status, firstname, lastname, street, city, region, postcode, country,"
                " telephone, subtotal_cents, shipping_cents) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (created, status, *(getattr(address, f) for f in ADDRESS_FIELDS), subtotal, shipping))
            order_id = int(cur.lastrowid or 0)
            self.db.executemany("INSERT INTO order_items VALUES (?, ?, ?, ?, ?)",
                                [(order_id, i.sku, i.name, i.price_cents, i.qty) for i in items])
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return order_id

    def flush(self) -> None:
        """Before a fork: nothing pending (autocommit), but make sure the file is written out."""
        self.db.execute("PRAGMA wal_checkpoint") if self._wal() else None

    def _wal(self) -> bool:
        return self.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    def reopen(self) -> None:
        """In a clone: the inherited connection points at the source's file; open the clone's own copy."""
        self.db.close()
        self.db = self._connect()

    # -- sessions and carts -------------------------------------------------------------------------------------
    def new_session(self, session_id: str) -> None:
        self.db.execute("INSERT OR IGNORE INTO sessions VALUES (?)", (session_id,))

    def sign_in(self, session: str, email: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO sign_ins VALUES (?, ?)", (session, email))

    def signed_in(self, session: str) -> str | None:
        """The account ``session`` signed in to (its email), or None."""
        row = self.db.execute("SELECT email FROM sign_ins WHERE session = ?", (session,)).fetchone()
        return str(row[0]) if row else None

    def add_to_cart(self, session: str, sku: str, qty: int) -> None:
        self.db.execute("INSERT INTO cart_items VALUES (?, ?, ?) ON CONFLICT(session, sku) "
                        "DO UPDATE SET qty = qty + excluded.qty", (session, sku, qty))

    def remove_from_cart(self, session: str, sku: str) -> bool:
        return self.db.execute("DELETE FROM cart_items WHERE session = ? AND sku = ?", (session, sku)).rowcount > 0

    def cart(self, session: str) -> list[tuple[str, int]]:
        rows = self.db.execute("SELECT sku, qty FROM cart_items WHERE session = ? ORDER BY sku", (session,))
        return [(sku, qty) for sku, qty in rows]

    # -- orders ---------------------------------------------------------------------------------------------------
    def place_order(self, session: str, address: Address, items: list[OrderItem]) -> int:
        """Turn the session's cart into an order (status pending) and empty the cart."""
        order_id = self._insert_order(STORE_DATE, "pending", address, items)
        self.db.execute("DELETE FROM cart_items WHERE session = ?", (session,))
        return order_id

    def orders(self) -> list[Order]:
        """Newest first."""
        ids = [row[0] for row in self.db.execute("SELECT id FROM orders ORDER BY created DESC, id DESC")]
        return [o for o in (self.order(i) for i in ids) if o is not None]

    def order(self, order_id: int) -> Order | None:
        row = self.db.execute(f"SELECT id, created, status, {', '.join(ADDRESS_FIELDS)}, subtotal_cents, "
                              "shipping_cents FROM orders WHERE id = ?", (order_id,)).fetchone()
        if row is None:
            return None
        items = [OrderItem(sku=s, name=n, price_cents=p, qty=q) for s, n, p, q in self.db.execute(
            "SELECT sku, name, price_cents, qty FROM order_items WHERE order_id = ? ORDER BY rowid", (order_id,))]
        address = Address(**dict(zip(ADDRESS_FIELDS, row[3:11], strict=True)))
        return Order(id=row[0], created=row[1], status=row[2], address=address, items=items,
                     subtotal_cents=row[11], shipping_cents=row[12])

    def latest_order_id(self) -> int | None:
        row = self.db.execute("SELECT MAX(id) FROM orders").fetchone()
        return row[0]

    # -- reviews --------------------------------------------------------------------------------------------------
    def add_review(self, sku: str, nickname: str, title: str, detail: str, rating: int) -> int:
        cur = self.db.execute("INSERT INTO reviews (sku, nickname, title, detail, rating, created) "
                              "VALUES (?, ?, ?, ?, ?, ?)", (sku, nickname, title, detail, rating, STORE_DATE))
        return int(cur.lastrowid or 0)

    def reviews(self, sku: str) -> list[CustomerReview]:
        """Newest first."""
        rows = self.db.execute("SELECT id, sku, nickname, title, detail, rating, created FROM reviews "
                               "WHERE sku = ? ORDER BY id DESC", (sku,))
        return [CustomerReview(id=r[0], sku=r[1], nickname=r[2], title=r[3], detail=r[4], rating=r[5],
                               created=r[6]) for r in rows]

    def close(self) -> None:
        self.db.close()
