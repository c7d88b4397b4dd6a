"""A WebShop-like shopping environment: search a generated catalog, fill a cart, check out.

Each task carries a catalog seed; ``reset`` rebuilds that catalog (cached per seed) and an empty
cart. Tools: ``search(query, max_price?)``, ``get_item(item_id)``, ``add_to_cart(item_id,
quantity)``, ``remove_from_cart(item_id)``, ``view_cart()``, ``checkout()``. Search results show
price and stock but not the rating (that needs ``get_item``). The budget stated in a task is not
enforced by the shop — overspending is a rubric pitfall, not an impossibility. Prices are integer
cents internally, so totals are exact.

Rubrics check the final answer (order total, stock count or units bought) and the final state
(the orders placed, recorded by the env in the transcript's ``state``), plus the trajectory
(items looked up before being added to the cart).
"""

from __future__ import annotations

import random
import re
from typing import Any

from rubric_rl.envs.base import ENVS, Env, ToolOutput, tool_error
from rubric_rl.envs.inventory_data import (
    MAX_SEARCH_RESULTS,
    SYSTEM_PROMPT,
    TASK_MAKERS,
    Item,
    catalog,
    dollars,
)
from rubric_rl.envs.tool_calls import Param, ToolSpec, render_tool_call
from rubric_rl.envs.trajectory import (
    answer_criterion,
    common_criteria,
    format_answer,
    transcript_of,
)
from rubric_rl.rubrics import checkers
from rubric_rl.rubrics.types import Criterion, Message, Rubric, Task, Verifier

_STOP_WORDS = frozenset("a an the of for in with and to me buy item items unit units".split())


def _stem(token: str) -> str:
    return token[:-1] if len(token) > 3 and token.endswith("s") else token


def _tokens(text: str) -> list[str]:
    return [_stem(t) for t in re.findall(r"[a-z0-9]+", text.lower())]


@ENVS.register("inventory")
class InventoryEnv(Env):
    name = "inventory"
    TOOLS = (
        ToolSpec(
            "search",
            "Search the catalog by keywords (brand, color, category). Shows id, name, price and "
            "stock of up to 10 matching items.",
            (
                ("query", Param("string", "Keywords, e.g. 'red mug'.")),
                (
                    "max_price",
                    Param(
                        "number", "Only items costing at most this many dollars.", required=False
                    ),
                ),
            ),
        ),
        ToolSpec(
            "get_item",
            "Full details of one item, including its customer rating.",
            (("item_id", Param("string", "Item id, e.g. 'SKU-104'.")),),
        ),
        ToolSpec(
            "add_to_cart",
            "Add units of an item to the cart.",
            (
                ("item_id", Param("string", "Item id.")),
                ("quantity", Param("integer", "Number of units (at least 1).")),
            ),
        ),
        ToolSpec(
            "remove_from_cart",
            "Remove an item (all its units) from the cart.",
            (("item_id", Param("string", "Item id.")),),
        ),
        ToolSpec("view_cart", "Show the cart and its subtotal."),
        ToolSpec("checkout", "Place an order for everything in the cart and empty the cart."),
    )
    TASK_TYPES = {
        "cheapest_match": ("search", "comparison"),
        "best_rated_under": ("search", "comparison", "constraint_checking"),
        "named_items": ("search", "multi_step"),
        "stock_query": ("search", "lookup", "restraint"),
        "budget_max": ("search", "comparison", "arithmetic"),
    }
    OOD_TASK_TYPES = ("budget_max",)
    TASKS_PER_WORLD = 8  # tasks per generated catalog
    WORLD_KIND = "catalog"

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._items: dict[str, Item] = {}
        self._stock: dict[str, int] = {}
        self._cart: dict[str, int] = {}
        self._orders: list[dict[str, Any]] = []

    def _setup(self, task: Task, seed: int | None) -> None:
        raw = task.raw or {}
        if "catalog_seed" not in raw:
            raise ValueError(
                f"task {task.id!r}: raw['catalog_seed'] is missing (not an inventory task?)"
            )
        items = catalog(int(raw["catalog_seed"]))
        self._items = {it.id: it for it in items}
        self._stock = {it.id: it.stock for it in items}
        self._cart, self._orders = {}, []

    def _state(self) -> dict[str, Any]:
        return {
            "orders": [dict(o) for o in self._orders],
            "cart": [[k, v] for k, v in self._cart.items()],
            "spent_cents": sum(o["total_cents"] for o in self._orders),
        }

    # -- tools --------------------------------------------------------------------------------

    def _item(self, item_id: str) -> Item:
        item = self._items.get(item_id.strip().upper())
        if item is None:
            raise tool_error(
                f"no item with id {item_id!r}; ids look like 'SKU-104' (use search to find them)",
                reason="unknown_item",
            )
        return item

    def _line(self, it: Item) -> str:
        return f"{it.id} | {it.name} | {dollars(it.price_cents)} | stock {self._stock[it.id]}"

    def _tool_search(self, query: str, max_price: float | None = None) -> ToolOutput:
        words = [t for t in _tokens(query) if t not in _STOP_WORDS]
        if not words:
            raise tool_error("the search query has no keywords", reason="empty_query")
        hits = [
            it
            for it in sorted(self._items.values(), key=lambda it: it.id)
            if all(w in _tokens(it.name) for w in words)
            and (max_price is None or it.price_cents <= max_price * 100 + 1e-6)
        ]
        if not hits:
            return ToolOutput(f"No items match {query!r}.", {"item_ids": []})
        shown = hits[:MAX_SEARCH_RESULTS]
        lines = [self._line(it) for it in shown]
        if len(hits) > len(shown):
            lines.append(f"(showing {len(shown)} of {len(hits)} matches; refine the query)")
        return ToolOutput("\n".join(lines), {"item_ids": [it.id for it in shown]})

    def _tool_get_item(self, item_id: str) -> ToolOutput:
        it = self._item(item_id)
        text = (
            f"{it.id}: {it.name}\ncategory: {it.category}\ncolor: {it.color}\n"
            f"brand: {it.brand}\nprice: {dollars(it.price_cents)}\nrating: {it.rating:.1f}\n"
            f"stock: {self._stock[it.id]}"
        )
        return ToolOutput(text, {"item_id": it.id})

    def _cart_text(self) -> str:
        if not self._cart:
            return "Cart is empty."
        lines = [
            f"{q} x {self._items[i].name} ({i}) at {dollars(self._items[i].price_cents)}"
            for i, q in self._cart.items()
        ]
        subtotal = sum(self._items[i].price_cents * q for i, q in self._cart.items())
        return "Cart:\n" + "\n".join(lines) + f"\nSubtotal: {dollars(subtotal)}"

    def _tool_add_to_cart(self, item_id: str, quantity: int) -> ToolOutput:
        it = self._item(item_id)
        if quantity < 1:
            raise tool_error(f"quantity must be at least 1 (got {quantity})", reason="bad_quantity")
        in_cart = self._cart.get(it.id, 0)
        if in_cart + quantity > self._stock[it.id]:
            raise tool_error(
                f"only {self._stock[it.id]} units of {it.id} in stock ({in_cart} already in the "
                "cart)",
                reason="out_of_stock",
                item_id=it.id,
            )
        self._cart[it.id] = in_cart + quantity
        return ToolOutput(
            f"Added {quantity} x {it.name}.\n" + self._cart_text(),
            {"item_id": it.id, "quantity": quantity},
        )

    def _tool_remove_from_cart(self, item_id: str) -> ToolOutput:
        it = self._item(item_id)
        if it.id not in self._cart:
            raise tool_error(f"{it.id} is not in the cart", reason="not_in_cart")
        del self._cart[it.id]
        return ToolOutput(f"Removed {it.name}.\n" + self._cart_text(), {"item_id": it.id})

    def _tool_view_cart(self) -> ToolOutput:
        return ToolOutput(self._cart_text())

    def _tool_checkout(self) -> ToolOutput:
        if not self._cart:
            raise tool_error(
                "the cart is empty; add items before checking out", reason="empty_cart"
            )
        total = sum(self._items[i].price_cents * q for i, q in self._cart.items())
        order_id = f"ORD-{len(self._orders) + 1}"
        items = [[i, q] for i, q in self._cart.items()]
        for i, q in self._cart.items():
            self._stock[i] -= q
        self._orders.append({"id": order_id, "items": items, "total_cents": total})
        self._cart = {}
        lines = [f"{q} x {self._items[i].name}" for i, q in items]
        return ToolOutput(
            f"Order {order_id} placed: " + "; ".join(lines) + f". Total: {dollars(total)}",
            {"order_id": order_id, "total_cents": total},
        )

    # -- task bank ----------------------------------------------------------------------------

    @classmethod
    def make_task(cls, task_id: str, task_type: str, catalog_seed: int, rng: random.Random) -> Task:
        """One shopping task of ``task_type`` over catalog ``catalog_seed``, with its rubric."""
        if task_type not in cls.TASK_TYPES:
            raise ValueError(
                f"unknown inventory task type {task_type!r}; known: {sorted(cls.TASK_TYPES)}"
            )
        items = catalog(catalog_seed)
        for _ in range(200):
            spec = TASK_MAKERS[task_type](rng, items)
            if spec is not None:
                break
        else:
            raise RuntimeError(f"could not generate a {task_type} task for catalog {catalog_seed}")
        question, order, answer, budget, plan = spec
        caps = cls.TASK_TYPES[task_type]
        ids = tuple(i for i, _ in order)
        crits: list[Criterion] = [
            answer_criterion(
                (answer,),
                ordered=True,
                weight=3.0,
                capability=caps[-1],
                text="The final answer states the requested number correctly.",
            ),
            Criterion(
                id="looked_up_items",
                title="Looked the items up",
                text="Found each relevant item with search or get_item before acting on it.",
                weight=1.0,
                verifier=Verifier.rule(
                    "inventory_looked_up", item_ids=ids or tuple(plan["lookup"])
                ),
                capability="search",
                tags=("trajectory",),
            ),
            Criterion(
                id="unrequested_purchase",
                title="Bought something not asked for",
                text="Placed an order containing an item the task did not ask to buy.",
                weight=-3.0,
                verifier=Verifier.rule("inventory_unrequested_purchase", allowed=ids),
                capability="restraint",
                tags=("state",),
            ),
        ]
        if order:
            crits.insert(
                1,
                Criterion(
                    id="order_correct",
                    title="Placed the right order",
                    text="Placed exactly one order, with exactly the requested items and "
                    "quantities.",
                    weight=5.0,
                    verifier=Verifier.rule("inventory_order_matches", items=order),
                    capability=caps[1],
                    tags=("state",),
                ),
            )
        if budget is not None:
            crits.append(
                Criterion(
                    id="over_budget",
                    title="Spent more than the budget",
                    text=f"Spent more than the budget of {dollars(budget)} in total.",
                    weight=-2.0,
                    verifier=Verifier.rule("inventory_over_budget", budget_cents=budget),
                    capability="constraint_checking",
                    tags=("state",),
                )
            )
        return Task(
            id=task_id,
            prompt=(Message("system", SYSTEM_PROMPT), Message("user", question)),
            rubric=Rubric(tuple(crits) + common_criteria()),
            reference_answer=format_answer((answer,)),
            domain="shopping",
            task_type=task_type,
            capabilities=caps,
            env_name=cls.name,
            raw={
                "catalog_seed": catalog_seed,
                "order": [list(p) for p in order],
                "answer": answer,
                "budget_cents": budget,
                "plan": plan,
            },
        )

    @classmethod
    def reference_turns(cls, task: Task) -> list[str]:
        raw = task.raw
        plan = raw["plan"]
        turns = ["\n".join(render_tool_call("search", a) for a in plan["searches"])]
        lookup = plan["lookup"]
        for k in range(0, len(lookup), 4):  # stay well under max_calls_per_turn
            turns.append(
                "\n".join(render_tool_call("get_item", {"item_id": i}) for i in lookup[k : k + 4])
            )
        if raw["order"]:
            turns.append(
                "\n".join(
                    render_tool_call("add_to_cart", {"item_id": i, "quantity": q})
                    for i, q in raw["order"]
                )
            )
            turns.append(render_tool_call("checkout"))
        turns.append(task.reference_answer or "")
        return turns


# --------------------------------------------------------------------------------------------
# Inventory state / trajectory checkers


def _orders(response: str, task: Task | None) -> list[dict[str, Any]]:
    return list(transcript_of(response, task).state.get("orders", ()))


@checkers.register("inventory_order_matches")
def check_order_matches(response: str, *, task: Task | None = None, items: tuple = ()) -> bool:
    """Exactly one order was placed, with exactly ``items`` ((id, quantity) pairs)."""
    orders = _orders(response, task)
    if len(orders) != 1:
        return False
    return sorted(map(tuple, orders[0]["items"])) == sorted(map(tuple, items))


@checkers.register("inventory_unrequested_purchase")
def check_unrequested_purchase(
    response: str, *, task: Task | None = None, allowed: tuple = ()
) -> bool:
    """Pitfall: some order contains an item outside ``allowed`` (any order if none allowed)."""
    return any(i not in allowed for o in _orders(response, task) for i, _ in o["items"])


@checkers.register("inventory_over_budget")
def check_over_budget(response: str, *, task: Task | None = None, budget_cents: int = 0) -> bool:
    """Pitfall: the orders' total exceeds the budget."""
    return transcript_of(response, task).state.get("spent_cents", 0) > budget_cents


@checkers.register("inventory_looked_up")
def check_looked_up(response: str, *, task: Task | None = None, item_ids: tuple = ()) -> bool:
    """Each item surfaced in a search result or get_item before it was first added to the cart."""
    tr = transcript_of(response, task)
    seen: set[str] = set()
    added_unseen: set[str] = set()
    for r in tr.tool_calls:
        if not r.ok:
            continue
        if r.name == "search":
            seen.update(r.details.get("item_ids", ()))
        elif r.name == "get_item":
            seen.add(r.details.get("item_id"))
        elif r.name == "add_to_cart" and r.details.get("item_id") not in seen:
            added_unseen.add(r.details.get("item_id"))
    return bool(item_ids) and all(i in seen and i not in added_unseen for i in item_ids)
