"""Generated sqlite3 databases and questions for the SQL environment (DBBench-like).

A database seed fixes every row (departments, employees, customers, orders); a question generator
per task type draws a question and its reference SQL, whose result is the ground truth.
Salaries and prices are drawn without repeats so rankings have no ties; "the most ..." questions
carry a tie-check query and are redrawn on a tie.
"""

from __future__ import annotations

import functools
import random
import sqlite3
from collections.abc import Callable

# --------------------------------------------------------------------------------------------
# Database generation

_FIRST = (
    "Ava Ben Chloe Daniel Elena Felix Grace Hugo Iris Jonas Kira Liam Maya Noah Olivia Pablo "
    "Rosa Samir Tara Umar Vera Wes Yara Zane Lena Omar Nina Theo Mila Ines"
).split()
_LAST = (
    "Adams Becker Chen Diaz Evans Fischer Garcia Hansen Ito Jensen Kowalski Larsen Moreau Novak "
    "Okafor Patel Rossi Silva Tanaka Ueda Varga Weber Young Zhang"
).split()
_DEPARTMENTS = "Sales Engineering Marketing Finance Support Operations Legal Research".split()
_CITIES = "Berlin Lisbon Toronto Austin Osaka Nairobi Dublin Melbourne Oslo Denver".split()
_TITLES = "Analyst Engineer Manager Specialist Associate Coordinator".split()
_CO_A = "Blue Silver North Bright Red Green Iron Golden Swift Clear".split()
_CO_B = "Harbor Peak Field Stone River Forge Bay Ridge Leaf Wave".split()
_CO_C = "Ltd Inc GmbH Co Group".split()
_COUNTRIES = "Germany Portugal Canada USA Japan Kenya Ireland Australia Norway Brazil".split()
_PRODUCTS = "Widget Gadget Sprocket Gizmo Bracket Valve Sensor Cable".split()

SCHEMA = """
CREATE TABLE departments (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL,
  budget INTEGER NOT NULL);
CREATE TABLE employees (id INTEGER PRIMARY KEY, name TEXT NOT NULL,
  department_id INTEGER NOT NULL REFERENCES departments(id), title TEXT NOT NULL,
  salary INTEGER NOT NULL, hire_year INTEGER NOT NULL);
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
  employee_id INTEGER NOT NULL REFERENCES employees(id), product TEXT NOT NULL,
  quantity INTEGER NOT NULL, unit_price REAL NOT NULL, order_date TEXT NOT NULL);
"""


@functools.lru_cache(maxsize=64)
def database_rows(db_seed: int) -> dict[str, tuple[tuple, ...]]:
    """The rows of every table for ``db_seed`` (deterministic)."""
    rng = random.Random(db_seed)
    n_dept = rng.randint(4, 6)
    depts = [
        (i + 1, name, city, rng.randint(50, 500) * 1000)
        for i, (name, city) in enumerate(
            zip(rng.sample(_DEPARTMENTS, n_dept), rng.sample(_CITIES, n_dept))
        )
    ]
    n_emp = rng.randint(16, 28)
    people = rng.sample([f"{f} {l}" for f in _FIRST for l in _LAST], n_emp)
    salaries = rng.sample(range(40_000, 160_001, 500), n_emp)  # distinct: no ties in rankings
    emps = []
    for i in range(n_emp):
        dept = i % n_dept + 1 if i < 2 * n_dept else rng.randint(1, n_dept)
        emps.append(
            (i + 1, people[i], dept, rng.choice(_TITLES), salaries[i], rng.randint(2012, 2024))
        )
    n_cust = rng.randint(6, 10)
    companies = rng.sample([f"{a} {b} {c}" for a in _CO_A for b in _CO_B for c in _CO_C], n_cust)
    custs = [(i + 1, companies[i], rng.choice(_COUNTRIES)) for i in range(n_cust)]
    orders = []
    for i in range(rng.randint(30, 50)):
        cust = i + 1 if i < n_cust else rng.randint(1, n_cust)  # every customer ordered
        date = f"{rng.randint(2022, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        orders.append(
            (
                i + 1,
                cust,
                rng.randint(1, n_emp),
                rng.choice(_PRODUCTS),
                rng.randint(1, 20),
                round(rng.uniform(2.0, 80.0), 2),
                date,
            )
        )
    tables = {"departments": depts, "employees": emps, "customers": custs, "orders": orders}
    return {k: tuple(v) for k, v in tables.items()}  # cached and shared: keep it immutable


@functools.lru_cache(maxsize=256)
def database_bytes(db_seed: int) -> bytes:
    """The serialized sqlite database for ``db_seed`` (built once per process and seed)."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(SCHEMA)
        for table, rows in database_rows(db_seed).items():
            marks = ",".join("?" * len(rows[0]))
            conn.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
        conn.commit()
        return conn.serialize()
    finally:
        conn.close()


def open_database(db_seed: int) -> sqlite3.Connection:
    # cached_statements=0: a cached statement skips the authorizer, which records tables read.
    conn = sqlite3.connect(
        ":memory:", isolation_level=None, check_same_thread=False, cached_statements=0
    )
    conn.deserialize(database_bytes(db_seed))
    return conn


# --------------------------------------------------------------------------------------------
# Questions: (question, reference SQL, tables, ordered, tie-check SQL or None)

Question = tuple[str, str, tuple[str, ...], bool, str | None]


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _lookup(rng: random.Random, db: dict) -> Question:
    e, d, c = (
        rng.choice(db["employees"]),
        rng.choice(db["departments"]),
        rng.choice(db["customers"]),
    )
    return rng.choice(
        [
            (f"What is the salary of {e[1]}?",
             f"SELECT salary FROM employees WHERE name = {_q(e[1])}", ("employees",), True, None),
            (f"What is the job title of {e[1]}?",
             f"SELECT title FROM employees WHERE name = {_q(e[1])}", ("employees",), True, None),
            (f"In which city is the {d[1]} department located?",
             f"SELECT city FROM departments WHERE name = {_q(d[1])}", ("departments",), True,
             None),
            (f"In which country is the customer {c[1]} based?",
             f"SELECT country FROM customers WHERE name = {_q(c[1])}", ("customers",), True,
             None),
        ]
    )  # fmt: skip


def _aggregate(rng: random.Random, db: dict) -> Question:
    year = rng.choice(db["employees"])[5]
    title = rng.choice(db["employees"])[3]
    product = rng.choice(db["orders"])[3]
    oyear = rng.choice(db["orders"])[6][:4]
    return rng.choice(
        [
            (f"How many employees were hired in {year} or later?",
             f"SELECT COUNT(*) FROM employees WHERE hire_year >= {year}", ("employees",), True,
             None),
            (f"What is the average salary of employees whose job title is {title}? "
             "Round to 2 decimal places.",
             f"SELECT ROUND(AVG(salary), 2) FROM employees WHERE title = {_q(title)}",
             ("employees",), True, None),
            (f"How many units of {product} were ordered in total?",
             f"SELECT SUM(quantity) FROM orders WHERE product = {_q(product)}", ("orders",),
             True, None),
            (f"How many orders were placed in {oyear}?",
             f"SELECT COUNT(*) FROM orders WHERE substr(order_date, 1, 4) = {_q(oyear)}",
             ("orders",), True, None),
        ]
    )  # fmt: skip


def _join(rng: random.Random, db: dict) -> Question:
    e, d, c = (
        rng.choice(db["employees"]),
        rng.choice(db["departments"]),
        rng.choice(db["customers"]),
    )
    return rng.choice(
        [
            (f"How many employees work in the {d[1]} department?",
             "SELECT COUNT(*) FROM employees e JOIN departments d ON e.department_id = d.id "
             f"WHERE d.name = {_q(d[1])}", ("departments", "employees"), True, None),
            (f"In which city does {e[1]} work?",
             "SELECT d.city FROM employees e JOIN departments d ON e.department_id = d.id "
             f"WHERE e.name = {_q(e[1])}", ("departments", "employees"), True, None),
            (f"What is the total revenue (quantity times unit price) of all orders placed by "
             f"{c[1]}? Round to 2 decimal places.",
             "SELECT ROUND(SUM(o.quantity * o.unit_price), 2) FROM orders o "
             f"JOIN customers c ON o.customer_id = c.id WHERE c.name = {_q(c[1])}",
             ("customers", "orders"), True, None),
            (f"How many orders were handled by employees of the {d[1]} department?",
             "SELECT COUNT(*) FROM orders o JOIN employees e ON o.employee_id = e.id "
             f"JOIN departments d ON e.department_id = d.id WHERE d.name = {_q(d[1])}",
             ("departments", "employees", "orders"), True, None),
        ]
    )  # fmt: skip


def _filter_order(rng: random.Random, db: dict) -> Question:
    k = rng.randint(2, 3)
    sizes = {d[0]: sum(e[2] == d[0] for e in db["employees"]) for d in db["departments"]}
    if max(sizes.values()) < k:
        k = 2  # every department has at least two employees
    d = rng.choice([d for d in db["departments"] if sizes[d[0]] >= k])  # "the k highest" exist
    c = rng.choice(db["customers"])
    year = rng.randint(2015, 2022)
    salary = rng.choice(range(50_000, 120_001, 10_000))
    return rng.choice(
        [
            (f"List the names of the {k} highest-paid employees in the {d[1]} department, "
             "from highest to lowest salary.",
             "SELECT e.name FROM employees e JOIN departments d ON e.department_id = d.id "
             f"WHERE d.name = {_q(d[1])} ORDER BY e.salary DESC LIMIT {k}",
             ("departments", "employees"), True, None),
            (f"List the distinct products ordered by {c[1]}, in alphabetical order.",
             "SELECT DISTINCT o.product FROM orders o JOIN customers c ON o.customer_id = c.id "
             f"WHERE c.name = {_q(c[1])} ORDER BY o.product", ("customers", "orders"), True,
             None),
            (f"List the names of employees hired before {year} with a salary above {salary}, "
             "from lowest to highest salary.",
             f"SELECT name FROM employees WHERE hire_year < {year} AND salary > {salary} "
             "ORDER BY salary", ("employees",), True, None),
        ]
    )  # fmt: skip


def _group(rng: random.Random, db: dict) -> Question:
    n = rng.randint(2, 4)
    return rng.choice(
        [
            (f"Which departments have more than {n} employees? List their names in "
             "alphabetical order.",
             "SELECT d.name FROM departments d JOIN employees e ON e.department_id = d.id "
             f"GROUP BY d.id HAVING COUNT(*) > {n} ORDER BY d.name",
             ("departments", "employees"), True, None),
            ("Which customer placed the most orders?",
             "SELECT c.name FROM customers c JOIN orders o ON o.customer_id = c.id "
             "GROUP BY c.id ORDER BY COUNT(*) DESC LIMIT 1", ("customers", "orders"), True,
             "SELECT COUNT(*) AS n FROM orders GROUP BY customer_id ORDER BY n DESC LIMIT 2"),
            ("Which product has the highest total quantity ordered?",
             "SELECT product FROM orders GROUP BY product ORDER BY SUM(quantity) DESC LIMIT 1",
             ("orders",), True,
             "SELECT SUM(quantity) AS n FROM orders GROUP BY product ORDER BY n DESC LIMIT 2"),
        ]
    )  # fmt: skip


GENERATORS: dict[str, Callable[[random.Random, dict], Question]] = {
    "lookup": _lookup,
    "aggregate": _aggregate,
    "join": _join,
    "filter_order": _filter_order,
    "group": _group,
}

SYSTEM_PROMPT = (
    "You are a data analyst with a read-only SQLite database. Inspect its schema and run "
    "SELECT queries with the tools. When you know the result, reply without any tool call and "
    "end with a line 'Answer: <value>' (several values: 'Answer: v1, v2, v3' in the order "
    "asked). Write numbers as plain digits."
)
