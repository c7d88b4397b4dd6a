"""Inventory (shopping) environment: catalog, tools, state rubrics, task bank."""

import re

import pytest

from rubric_rl.envs.inventory import InventoryEnv
from rubric_rl.envs.inventory_data import catalog
from rubric_rl.envs.tool_calls import render_tool_call as call
from rubric_rl.envs.tool_envs import env_for_task, task_bank
from rubric_rl.envs.trajectory import score_rules
from rubric_rl.rubrics.rewards import rubric_reward


def verdicts(task, response):
    return {k: v.met for k, v in score_rules(task, response).items()}


def reward(task, response):
    return rubric_reward("weighted", task.rubric, score_rules(task, response)).value


def first(task_type, split="train", n=40, seed=0):
    return next(t for t in task_bank("inventory", split, n, seed) if t.task_type == task_type)


def items_of(task):
    return {it.id: it for it in catalog(task.raw["catalog_seed"])}


def dollars(cents):
    return f"${cents // 100}.{cents % 100:02d}"


def play(task, turns):
    env = env_for_task(task)
    env.reset(task)
    results = [env.step(t) for t in turns]
    return env, results


# ---------------------------------------------------------------------------------------------
# Catalog and task bank


def test_catalog_is_deterministic_with_distinct_prices():
    a, b = catalog(5), catalog(5)
    assert a == b and a != catalog(6)
    assert len({it.id for it in a}) == len(a) == len({it.price_cents for it in a})
    assert len({it.name for it in a}) == len(a)


def test_task_bank_reproducible_typed_and_split():
    a = task_bank("inventory", "train", 24, 3)
    assert a == task_bank("inventory", "train", 24, 3)
    assert [t.raw for t in a] == [t.raw for t in task_bank("inventory", "train", 24, 3)]
    assert [t.question for t in a] != [t.question for t in task_bank("inventory", "train", 24, 4)]
    assert {t.task_type for t in a} == {
        "cheapest_match",
        "best_rated_under",
        "named_items",
        "stock_query",
    }
    assert {t.task_type for t in task_bank("inventory", "ood", 5, 3)} == {"budget_max"}
    for t in a:
        assert t.env_name == "inventory" and t.capabilities == InventoryEnv.TASK_TYPES[t.task_type]
        assert ("order_correct" in t.rubric.ids) == (t.task_type != "stock_query")


@pytest.mark.parametrize("split", ["train", "heldout", "ood"])
def test_reference_solution_passes_its_rubric(split):
    for task in task_bank("inventory", split, 40, 5):
        env, results = play(task, InventoryEnv.reference_turns(task))
        assert results[-1].done and all(not r.done for r in results[:-1])
        assert all(c["ok"] for r in results for c in r.info["tool_calls"]), task.id
        v = verdicts(task, env.response())
        assert all(v[c.id] is (c.weight > 0) for c in task.rubric), (task.id, v)
        assert reward(task, env.response()) == 1.0


def test_ground_truth_matches_plain_python():
    checked = 0
    for t in task_bank("inventory", "train", 80, 2) + task_bank("inventory", "ood", 20, 2):
        items = list(items_of(t).values())
        q = t.question
        if m := re.match(r"Buy (\d) units? of the cheapest (\w+) ([\w -]+?) that is in stock", q):
            qty, color, cat = int(m[1]), m[2], m[3]
            best = min(
                (i for i in items if i.color == color and i.category == cat and i.stock),
                key=lambda i: i.price_cents,
            )
            assert t.raw["order"] == [[best.id, qty]]
            assert t.raw["answer"] == pytest.approx(best.price_cents * qty / 100)
            assert t.raw["budget_cents"] >= best.price_cents * qty
        elif m := re.match(r"How many units of the (.+) are in stock", q):
            assert t.raw["answer"] == next(i.stock for i in items if i.name == m[1])
            assert t.raw["order"] == []
        elif m := re.match(r"You have \$(\d+)\.00\. .* cheapest (\w+) ([\w -]+?) that", q):
            best = min(
                (i for i in items if i.color == m[2] and i.category == m[3] and i.stock),
                key=lambda i: i.price_cents,
            )
            units = min(int(m[1]) * 100 // best.price_cents, best.stock)
            assert t.raw["order"] == [[best.id, units]] and t.raw["answer"] == units
        else:
            continue
        checked += 1
    assert checked >= 30


# ---------------------------------------------------------------------------------------------
# Tools


def test_search_and_get_item_observations():
    task = first("cheapest_match")
    color, cat = re.search(r"cheapest (\w+) ([\w -]+?) that", task.question).groups()
    items = sorted(items_of(task).values(), key=lambda i: i.id)
    env, (r1, r2) = play(
        task,
        [
            call("search", {"query": f"{color.upper()} {cat}s"}),
            call("get_item", {"item_id": task.raw["order"][0][0].lower()}),
        ],
    )
    expected = [
        f"{i.id} | {i.name} | {dollars(i.price_cents)} | stock {i.stock}"
        for i in items
        if i.color == color and i.category == cat
    ]
    assert r1.tool_messages[0].content == "\n".join(expected)
    it = items_of(task)[task.raw["order"][0][0]]
    assert r2.tool_messages[0].content == (
        f"{it.id}: {it.name}\ncategory: {it.category}\ncolor: {it.color}\nbrand: {it.brand}\n"
        f"price: {dollars(it.price_cents)}\nrating: {it.rating:.1f}\nstock: {it.stock}"
    )
    _, (r,) = play(task, [call("search", {"query": f"{cat}", "max_price": 0.01})])
    assert r.tool_messages[0].content == f"No items match '{cat}'."
    # A huge cap is no cap (and no overflow); the cap is inclusive of the exact price.
    it = items_of(task)[task.raw["order"][0][0]]
    _, (r,) = play(
        task,
        [
            call("search", {"query": it.name, "max_price": 1e308})
            + call("search", {"query": it.name, "max_price": it.price_cents / 100})
            + call("search", {"query": it.name, "max_price": it.price_cents / 100 - 0.01})
        ],
    )
    outs = [m.content for m in r.tool_messages]
    line = f"{it.id} | {it.name} | {dollars(it.price_cents)} | stock {it.stock}"
    assert outs == [line, line, f"No items match '{it.name}'."]


def test_cart_checkout_and_stock():
    task = first("named_items")
    (a, qa), (b, qb) = task.raw["order"]
    items = items_of(task)
    env, rs = play(
        task,
        [
            call("checkout"),
            call("add_to_cart", {"item_id": a, "quantity": items[a].stock + 1}),
            call("add_to_cart", {"item_id": a, "quantity": 0}),
            call("add_to_cart", {"item_id": "SKU-999", "quantity": 1}),
            call("add_to_cart", {"item_id": a, "quantity": qa})
            + call("add_to_cart", {"item_id": b, "quantity": qb}),
            call("checkout") + call("get_item", {"item_id": a}),
        ],
    )
    msgs = [m.content for r in rs for m in r.tool_messages]
    assert msgs[0] == "Error (tool_error): the cart is empty; add items before checking out"
    assert msgs[1] == (
        f"Error (tool_error): only {items[a].stock} units of {a} in stock (0 already in the cart)"
    )
    assert msgs[2] == "Error (tool_error): quantity must be at least 1 (got 0)"
    assert msgs[3].startswith("Error (tool_error): no item with id 'SKU-999'")
    total = items[a].price_cents * qa + items[b].price_cents * qb
    assert msgs[5].endswith(f"Subtotal: {dollars(total)}")
    assert msgs[6] == (
        f"Order ORD-1 placed: {qa} x {items[a].name}; {qb} x {items[b].name}. "
        f"Total: {dollars(total)}"
    )
    assert msgs[7].endswith(f"stock: {items[a].stock - qa}")
    state = env.transcript().state
    assert state == {
        "orders": [{"id": "ORD-1", "items": [[a, qa], [b, qb]], "total_cents": total}],
        "cart": [],
        "spent_cents": total,
    }
    # Stock lives in the env, not the cached catalog: a fresh env starts full again.
    _, (r,) = play(task, [call("get_item", {"item_id": a})])
    assert r.tool_messages[0].content.endswith(f"stock: {items[a].stock}")


# ---------------------------------------------------------------------------------------------
# Rubric verdicts on scripted episodes


def test_wrong_item_over_budget_blind_purchase():
    """Buys the priciest matching item without looking it up, blows the budget."""
    for task in task_bank("inventory", "train", 40, 0):
        if task.task_type != "cheapest_match":
            continue
        ((want, qty),) = task.raw["order"]
        pricey = max(items_of(task).values(), key=lambda i: i.price_cents * (i.stock >= qty))
        total = pricey.price_cents * qty
        if total > task.raw["budget_cents"]:
            break
    else:
        raise AssertionError("no cheapest_match task where an over-budget purchase is possible")
    env, _ = play(
        task,
        [
            call("add_to_cart", {"item_id": pricey.id, "quantity": qty}),
            call("checkout"),
            f"Done.\nAnswer: {total / 100:.2f}",
        ],
    )
    assert verdicts(task, env.response()) == {
        "answer_correct": False,
        "order_correct": False,
        "looked_up_items": False,
        "unrequested_purchase": True,
        "over_budget": True,
        "answer_format": True,
        "malformed_tool_call": False,
        "tool_call_after_answer": False,
    }
    assert reward(task, env.response()) == pytest.approx((1 - 3 - 2) / 10)


def test_stock_query_must_not_buy():
    task = first("stock_query")
    (item,) = task.raw["plan"]["lookup"]
    stock = task.raw["answer"]
    turns = [call("get_item", {"item_id": item})]
    if stock:
        turns += [call("add_to_cart", {"item_id": item, "quantity": 1}), call("checkout")]
    env, _ = play(task, turns + [f"There are ${stock} left.\nAnswer: ${stock}"])
    v = verdicts(task, env.response())
    assert v["answer_correct"] and v["looked_up_items"] and v["answer_format"]
    assert v["unrequested_purchase"] is bool(stock)
    assert reward(task, env.response()) == pytest.approx(1.0 - 0.6 * bool(stock))


def test_two_orders_are_not_the_right_order():
    task = first("named_items")
    (a, qa), (b, qb) = task.raw["order"]
    total = task.raw["answer"]
    env, _ = play(
        task,
        [
            call("search", {"query": items_of(task)[a].name})
            + call("search", {"query": items_of(task)[b].name}),
            call("add_to_cart", {"item_id": a, "quantity": qa}) + call("checkout"),
            call("add_to_cart", {"item_id": b, "quantity": qb}) + call("checkout"),
            f"Answer: {total:.2f}",
        ],
    )
    v = verdicts(task, env.response())
    assert v["order_correct"] is False and v["unrequested_purchase"] is False
    assert v["answer_correct"] and v["looked_up_items"]
    assert reward(task, env.response()) == pytest.approx(5 / 10)


def test_truncated_episode_has_no_answer():
    task = first("cheapest_match")
    env = InventoryEnv(max_turns=1)
    env.reset(task)
    res = env.step(call("view_cart"))
    assert res.done and res.info["status"] == "max_turns"
    assert res.tool_messages[0].content == "Cart is empty."
    v = verdicts(task, res.info["response"])
    assert not v["answer_correct"] and not v["answer_format"] and not v["order_correct"]


def test_lookup_must_precede_adding_to_cart():
    task = first("cheapest_match")
    ((want, qty),) = task.raw["order"]
    color, cat = re.search(r"cheapest (\w+) ([\w -]+?) that", task.question).groups()
    blind, _ = play(
        task,
        [
            call("add_to_cart", {"item_id": want, "quantity": qty}),
            call("search", {"query": f"{color} {cat}"}) + call("checkout"),
            f"Answer: {task.raw['answer']:.2f}",
        ],
    )
    v = verdicts(task, blind.response())
    assert v["looked_up_items"] is False and v["order_correct"] and v["answer_correct"]
    assert reward(task, blind.response()) == pytest.approx(9 / 10)
