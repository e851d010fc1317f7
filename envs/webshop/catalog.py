"""The shop's catalog, generated deterministically from a seed: categories, products with titles, descriptions,
attributes, prices, ratings and reviews.

Owns: the vocabulary and the generator. Same (size, seed) gives the same catalog on any machine (``random.Random``
only, no hash randomisation). Products are packed (``PackedRecords``) so forks of a shop share them while reading.
Must never: depend on anything but its arguments.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec
import numpy as np

from ..app import HugeHeap
from .packed import PackedRecords

CATEGORIES: dict[str, list[str]] = {
    "Electronics": ["Headphones", "Speakers", "Cameras", "Chargers", "Smart Watches"],
    "Home & Kitchen": ["Cookware", "Coffee Makers", "Bedding", "Storage", "Lighting"],
    "Sports & Outdoors": ["Camping", "Cycling", "Fitness", "Hiking", "Yoga"],
    "Beauty & Personal Care": ["Skin Care", "Hair Care", "Fragrance", "Makeup", "Shaving"],
    "Grocery & Gourmet Food": ["Coffee", "Tea", "Snacks", "Spices", "Chocolate"],
    "Office Products": ["Notebooks", "Pens", "Desk Organizers", "Printers", "Labels"],
    "Toys & Games": ["Puzzles", "Board Games", "Building Sets", "Dolls", "Outdoor Play"],
    "Clothing": ["Jackets", "Shoes", "T-Shirts", "Hats", "Socks"],
}
NOUNS: dict[str, list[str]] = {
    "Headphones": ["Headphones", "Earbuds", "Headset"], "Speakers": ["Speaker", "Soundbar", "Boombox"],
    "Cameras": ["Camera", "Action Cam", "Webcam"], "Chargers": ["Charger", "Power Bank", "Charging Cable"],
    "Smart Watches": ["Smart Watch", "Fitness Tracker", "Watch Band"], "Cookware": ["Skillet", "Saucepan", "Wok"],
    "Coffee Makers": ["Coffee Maker", "Espresso Machine", "French Press"], "Bedding": ["Duvet", "Pillow", "Sheet Set"],
    "Storage": ["Storage Bin", "Shelf", "Basket"], "Lighting": ["Desk Lamp", "LED Strip", "Floor Lamp"],
    "Camping": ["Tent", "Sleeping Bag", "Lantern"], "Cycling": ["Bike Helmet", "Bike Light", "Saddle"],
    "Fitness": ["Dumbbell Set", "Resistance Band", "Jump Rope"], "Hiking": ["Backpack", "Trekking Poles", "Water Bottle"],
    "Yoga": ["Yoga Mat", "Yoga Block", "Yoga Strap"], "Skin Care": ["Moisturizer", "Serum", "Sunscreen"],
    "Hair Care": ["Shampoo", "Conditioner", "Hair Oil"], "Fragrance": ["Eau de Parfum", "Body Mist", "Cologne"],
    "Makeup": ["Lipstick", "Mascara", "Foundation"], "Shaving": ["Razor", "Shaving Cream", "Beard Trimmer"],
    "Coffee": ["Coffee Beans", "Ground Coffee", "Coffee Pods"], "Tea": ["Green Tea", "Black Tea", "Herbal Tea"],
    "Snacks": ["Trail Mix", "Protein Bar", "Pretzels"], "Spices": ["Paprika", "Cumin", "Spice Set"],
    "Chocolate": ["Dark Chocolate", "Truffles", "Cocoa Powder"], "Notebooks": ["Notebook", "Journal", "Planner"],
    "Pens": ["Gel Pen", "Fountain Pen", "Marker Set"], "Desk Organizers": ["Desk Organizer", "Pen Holder", "File Tray"],
    "Printers": ["Printer", "Ink Cartridge", "Toner"], "Labels": ["Label Maker", "Shipping Labels", "Name Tags"],
    "Puzzles": ["Jigsaw Puzzle", "Puzzle Cube", "Brain Teaser"], "Board Games": ["Board Game", "Card Game", "Chess Set"],
    "Building Sets": ["Building Kit", "Brick Set", "Magnetic Tiles"], "Dolls": ["Doll", "Dollhouse", "Action Figure"],
    "Outdoor Play": ["Kite", "Water Blaster", "Frisbee"], "Jackets": ["Rain Jacket", "Puffer Jacket", "Fleece"],
    "Shoes": ["Running Shoes", "Sneakers", "Hiking Boots"], "T-Shirts": ["T-Shirt", "Polo Shirt", "Tank Top"],
    "Hats": ["Baseball Cap", "Beanie", "Sun Hat"], "Socks": ["Crew Socks", "Ankle Socks", "Wool Socks"],
}
BRANDS = ["Acme", "Northwind", "Lumina", "Vertex", "Solace", "Bramble", "Kestrel", "Orchid", "Quartz", "Tidewater",
          "Copperline", "Evergreen", "Halcyon", "Juniper", "Meridian", "Nimbus", "Pinnacle", "Redwood", "Sable",
          "Wildflower"]
ADJECTIVES = ["Wireless", "Compact", "Premium", "Ultralight", "Classic", "Deluxe", "Portable", "Ergonomic",
              "Organic", "Waterproof", "Rechargeable", "Adjustable", "Foldable", "Heavy-Duty", "Eco-Friendly",
              "Noise-Cancelling", "Stainless", "Vintage", "Smart", "Travel"]
COLORS = ["Black", "White", "Silver", "Navy", "Red", "Green", "Gray", "Beige", "Pink", "Teal"]
MATERIALS = ["Aluminum", "Cotton", "Bamboo", "Steel", "Silicone", "Leather", "Nylon", "Ceramic", "Glass", "Wool"]
FIRST = ["Emma", "Liam", "Olivia", "Noah", "Ava", "Ethan", "Sophia", "Mason", "Isabella", "Lucas", "Mia", "Logan",
         "Amelia", "James", "Harper", "Elijah", "Evelyn", "Aiden", "Abigail", "Carter", "Grace", "Samuel", "Chloe",
         "Henry", "Zoe", "Owen", "Nora", "Jack", "Lily", "Leo"]
LAST = ["Lopez", "Smith", "Nguyen", "Garcia", "Brown", "Khan", "Muller", "Rossi", "Kim", "Patel", "Cohen", "Silva",
        "Novak", "Okafor", "Larsen", "Tanaka", "Dubois", "Moreno", "Ivanova", "Walsh"]
PRAISE = ["works exactly as described", "great value for the price", "sturdy and well made", "arrived quickly",
          "my family loves it", "better than the one I had before", "easy to set up", "looks even nicer in person"]
COMPLAINTS = ["stopped working after a week", "smaller than expected", "the ear cups are small",
              "instructions were confusing", "the color is off", "too loud", "packaging was damaged",
              "battery life is short", "feels cheap", "the strap broke"]
FEATURES = ["long battery life", "a soft-touch finish", "fast charging", "a one-year warranty", "dishwasher-safe parts",
            "a travel pouch", "recycled packaging", "a lightweight frame", "a quiet motor", "reinforced seams"]


class Review(msgspec.Struct, frozen=True, array_like=True):
    author: str
    rating: int  # 1..5
    title: str
    text: str
    date: str  # YYYY-MM-DD


class Product(msgspec.Struct, frozen=True, array_like=True):
    sku: str
    name: str
    category: str  # "Top/Sub"
    brand: str
    price_cents: int
    attributes: dict[str, str]
    description: str
    reviews: list[Review]

    @property
    def rating(self) -> float:
        return round(sum(r.rating for r in self.reviews) / len(self.reviews), 1) if self.reviews else 0.0

    @property
    def price(self) -> str:
        return f"${self.price_cents // 100}.{self.price_cents % 100:02d}"


def _review(rng: random.Random, noun: str) -> Review:
    rating = rng.choices([1, 2, 3, 4, 5], weights=[1, 1, 2, 4, 6])[0]
    good = rating >= 4
    phrase = rng.choice(PRAISE if good else COMPLAINTS)
    extra = rng.choice(COMPLAINTS if good else PRAISE)
    title = (rng.choice(["Love it", "Great buy", "Solid", "Recommended"]) if good
             else rng.choice(["Disappointed", "Not great", "Meh", "Returned it"]))
    text = f"The {noun.lower()} {phrase}. " + (f"Only complaint: {extra}." if good and rng.random() < 0.3 else
                                               f"On the plus side, it {extra}." if not good else "")
    date = f"20{rng.randint(19, 23)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    return Review(author=f"{rng.choice(FIRST)} {rng.choice(LAST)}", rating=rating, title=title, text=text.strip(),
                  date=date)


def generate_products(size: int, seed: int) -> list[Product]:
    rng = random.Random(f"catalog:{seed}")
    subcategories = [(top, sub) for top, subs in CATEGORIES.items() for sub in subs]
    products = []
    for i in range(size):
        top, sub = subcategories[i % len(subcategories)] if i < len(subcategories) else rng.choice(subcategories)
        noun = rng.choice(NOUNS[sub])
        brand = rng.choice(BRANDS)
        adjective = rng.choice(ADJECTIVES)
        color, material = rng.choice(COLORS), rng.choice(MATERIALS)
        model = f"{rng.choice('ABCDEFGHJKLMNPRSTUVWXZ')}{rng.randint(10, 999)}"
        name = f"{brand} {adjective} {noun} {model}"
        features = rng.sample(FEATURES, 2)
        description = (f"The {brand} {noun} {model} is a {adjective.lower()} {noun.lower()} in {color.lower()} "
                       f"{material.lower()}, with {features[0]} and {features[1]}. Part of our {sub.lower()} "
                       f"range in {top}.")
        price_cents = int(round(rng.lognormvariate(3.2, 0.8) * 100)) + 99
        reviews = [_review(rng, noun) for _ in range(rng.choices([0, 1, 2, 3, 5, 8, 12],
                                                                 weights=[2, 3, 3, 3, 3, 2, 1])[0])]
        products.append(Product(sku=f"B{seed % 1000:03d}{i:07d}", name=name, category=f"{top}/{sub}", brand=brand,
                                price_cents=price_cents,
                                attributes={"color": color, "material": material, "model": model},
                                description=description, reviews=reviews))
    return products


class Catalog:
    """The packed catalog: ``catalog[i]`` is a ``Product`` decoded on access."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self.products = PackedRecords(Product, generate_products(size, seed))

    def __len__(self) -> int:
        return len(self.products)

    def __getitem__(self, index: int) -> Product:
        return self.products[index]

    def categories(self) -> list[str]:
        return [f"{top}/{sub}" for top, subs in CATEGORIES.items() for sub in subs]

    def close(self) -> None:
        self.products.close()


class Thumbnails:
    """Every product's image (``px`` x ``px`` RGB), decoded and kept in memory as a shop's image cache does; in a
    huge-page heap, so forks share them. Deterministic per (size, seed): coarse colour blocks, scaled up."""

    def __init__(self, size: int, seed: int, px: int):
        self.size, self.px = size, px
        self.heap = HugeHeap(max(size * px * px * 3, 1))
        self._view()
        rng = np.random.default_rng(seed)
        block = max(px // 4, 1)
        for start in range(0, size, 4096):  # in chunks: the scaled-up copy is never made for all at once
            n = min(4096, size - start)
            coarse = rng.integers(0, 256, size=(n, -(-px // block), -(-px // block), 3), dtype=np.uint8)
            fine = coarse.repeat(block, axis=1).repeat(block, axis=2)
            self.images[start:start + n] = fine[:, :px, :px]

    def _view(self) -> None:
        size, px = self.size, self.px
        self.images = np.frombuffer(self.heap.map, dtype=np.uint8, count=size * px * px * 3).reshape(size, px, px, 3)

    def __getstate__(self) -> dict[str, Any]:
        """For a state image: the heap (its bytes out of band), not the view over it."""
        return {"size": self.size, "px": self.px, "heap": self.heap}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.size, self.px, self.heap = state["size"], state["px"], state["heap"]
        self._view()

    def __getitem__(self, index: int) -> np.ndarray:
        return self.images[index]

    @property
    def nbytes(self) -> int:
        return self.heap.size

    def close(self) -> None:
        del self.images
        self.heap.close()
