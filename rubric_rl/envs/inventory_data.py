"""Generated store catalogs and shopping tasks for the inventory environment (WebShop-like).

A catalog seed fixes every item (brand, color, category, price, rating, stock); a task maker per
task type draws a task and its ground truth (the order to place and the answer to give) from the
catalog, redrawing when the answer would be ambiguous (price or rating ties, an item priced
exactly at a cap). Prices are integer cents, all distinct within a catalog.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Sequence
from typing import Any

_BRANDS = "Classic Eco Pro Mini Deluxe Urban Trail Studio Nordic Vivid".split()
_COLORS = "red blue green black white yellow".split()
_CATEGORIES = {  # category -> price range in cents
    "t-shirt": (900, 3500),
    "mug": (500, 2000),
    "backpack": (2500, 12000),
    "lamp": (1500, 8000),
    "notebook": (300, 1500),
    "headphones": (2000, 20000),
    "water bottle": (800, 4000),
    "scarf": (1000, 4500),
}
MAX_SEARCH_RESULTS = 10


@dataclasses.dataclass(frozen=True)
class Item:
    id: str
    brand: str
    color: str
    category: str
    price_cents: int
    rating: float
    stock: int

    @property
    def name(self) -> str:
        return f"{self.brand} {self.color} {self.category}"


def dollars(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


@functools.lru_cache(maxsize=256)
def catalog(catalog_seed: int) -> tuple[Item, ...]:
    """The store's items for ``catalog_seed`` (deterministic; prices distinct)."""
    rng = random.Random(catalog_seed)
    combos = [(b, c, k) for b in _BRANDS for c in _COLORS for k in _CATEGORIES]
    picked = rng.sample(combos, rng.randint(40, 56))
    used: set[int] = set()
    items = []
    # ``picked`` is in random order, so ids say nothing about category: the model has to search.
    for i, (brand, color, cat) in enumerate(picked):
        lo, hi = _CATEGORIES[cat]
        cents = rng.randrange(lo, hi)
        while cents in used:
            cents = rng.randrange(lo, hi)
        used.add(cents)
        stock = 0 if rng.random() < 0.12 else rng.randint(1, 25)
        items.append(
            Item(f"SKU-{101 + i}", brand, color, cat, cents, rng.randint(20, 50) / 10, stock)
        )
    return tuple(items)


SYSTEM_PROMPT = (
    "You are a shopping assistant for an online store. Use the tools to search the catalog, "
    "inspect items, manage the cart and check out. Prices are in US dollars. When the task is "
    "done, reply without any tool call and end with a line 'Answer: <value>' (numbers as plain "
    "digits, e.g. 'Answer: 23.97')."
)


# --------------------------------------------------------------------------------------------
# Task makers: (question, order ((id, qty), ...), answer, budget_cents | None, plan) or None.
# ``plan`` drives the reference solution: the searches to run and the items to inspect.

Spec = tuple[str, tuple[tuple[str, int], ...], Any, int | None, dict[str, Any]] | None


def _cheapest(rng: random.Random, items: Sequence[Item], min_stock: int) -> tuple | None:
    color, cat = rng.choice(_COLORS), rng.choice(list(_CATEGORIES))
    pool = [it for it in items if it.color == color and it.category == cat and it.stock > 0]
    if len(pool) < 2:
        return None
    best = min(pool, key=lambda it: it.price_cents)
    return (color, cat, best) if best.stock >= min_stock else None


def _make_cheapest_match(rng: random.Random, items: Sequence[Item]) -> Spec:
    q = rng.randint(1, 3)
    found = _cheapest(rng, items, q)
    if found is None:
        return None
    color, cat, best = found
    total = best.price_cents * q
    budget = -(-total * 5 // 4 // 100) * 100  # 25% headroom, whole dollars
    return (
        f"Buy {q} unit{'s' * (q > 1)} of the cheapest {color} {cat} that is in stock. "
        f"Your budget is {dollars(budget)}. Reply with the order total.",
        ((best.id, q),),
        total / 100,
        budget,
        {"searches": [{"query": f"{color} {cat}"}], "lookup": []},
    )


def _make_best_rated_under(rng: random.Random, items: Sequence[Item]) -> Spec:
    cat = rng.choice(list(_CATEGORIES))
    lo, hi = _CATEGORIES[cat]
    cap = rng.randrange(lo // 100 + 2, hi // 100 + 1)
    in_cat = [it for it in items if it.category == cat]
    if any(it.price_cents == cap * 100 for it in in_cat):
        return None  # "under $cap" must not hinge on an item priced exactly at the cap
    pool = [it for it in in_cat if it.price_cents < cap * 100]
    in_stock = [it for it in pool if it.stock > 0]
    if len(in_stock) < 2 or len(pool) > MAX_SEARCH_RESULTS:
        return None
    ranked = sorted(in_stock, key=lambda it: -it.rating)
    if ranked[0].rating == ranked[1].rating:
        return None
    best = ranked[0]
    return (
        f"Buy one {cat} priced under ${cap} that is in stock and has the highest customer "
        "rating among those. Reply with the order total.",
        ((best.id, 1),),
        best.price_cents / 100,
        None,
        {
            "searches": [{"query": cat, "max_price": cap}],
            "lookup": [it.id for it in sorted(pool, key=lambda it: it.id)],
        },
    )


def _make_named_items(rng: random.Random, items: Sequence[Item]) -> Spec:
    a, b = rng.sample([it for it in items if it.stock >= 3], 2)
    qa, qb = rng.randint(1, 3), rng.randint(1, 3)
    total = a.price_cents * qa + b.price_cents * qb
    return (
        f"Buy {qa} x {a.name} and {qb} x {b.name} in a single order. Reply with the order total.",
        tuple(sorted(((a.id, qa), (b.id, qb)))),
        total / 100,
        None,
        {"searches": [{"query": a.name}, {"query": b.name}], "lookup": []},
    )


def _make_stock_query(rng: random.Random, items: Sequence[Item]) -> Spec:
    it = rng.choice(items)
    return (
        f"How many units of the {it.name} are in stock? Do not buy anything.",
        (),
        it.stock,
        None,
        {"searches": [{"query": it.name}], "lookup": [it.id]},
    )


def _make_budget_max(rng: random.Random, items: Sequence[Item]) -> Spec:
    found = _cheapest(rng, items, 2)
    if found is None:
        return None
    color, cat, best = found
    budget = rng.randint(2, 2 * best.stock) * best.price_cents + rng.randrange(best.price_cents)
    budget = budget // 100 * 100
    q = min(budget // best.price_cents, best.stock)
    if q < 2:
        return None
    return (
        f"You have {dollars(budget)}. Buy as many units as you can afford of the cheapest "
        f"{color} {cat} that is in stock (no more than the stock), in a single order. Reply "
        "with the number of units bought.",
        ((best.id, q),),
        q,
        budget,
        {"searches": [{"query": f"{color} {cat}"}], "lookup": []},
    )


TASK_MAKERS = {
    "cheapest_match": _make_cheapest_match,
    "best_rated_under": _make_best_rated_under,
    "named_items": _make_named_items,
    "stock_query": _make_stock_query,
    "budget_max": _make_budget_max,
}
