"""The stateful world of the ops domain: a shop's back office, with orders, stock and
bookings, and tools that read it and change it.

    list_orders(customer, page)    one page (PAGE_SIZE) of a customer's orders: id, status, total
    get_order(order_id)            an order in full: item, quantity, total, days promised and delivered
    refund(order_id, amount)       refund part or all of a delivered order (fully refunded: "refunded")
    approve(ref)                   approve a refund or cancellation over the approval limit (order or booking)
    cancel_order(order_id)         cancel a pending order; its items go back to stock by themselves
    restock(item, qty)             put units of an item back in stock
    get_stock(item)                units of an item in stock
    list_bookings(customer, page)  one page of a customer's bookings: id, day, deposit, status
    cancel_booking(booking_id)     cancel an active booking; its deposit is refunded by itself

Failures an agent must get through, all from the world's JSON (so a replay of the same
calls meets the same ones):

- "service busy": `busy` maps a call key (`refund:O-1234`, `list_orders:ann:2`, ...) to the
  number of times that call fails before it goes through; a failed call changes nothing
  but the count. Keys name calls every solution makes, so each costs every solver the
  same retries.
- a precondition: a refund or cancellation over `approval_limit` fails until `approve(ref)`.
- pagination: a customer's listing is PAGE_SIZE lines a page, with the next page named.

Tools raise on a failure (ToolBox turns that into an "Error: ..." observation): a world
is plain trusted Python, one per episode (`toolbox_for_task(task)` builds a fresh one from
the task's JSON alone, so a sandboxed tool process can rebuild it). `state()` is what the
verifier judges: every order's and booking's status and refunded amount, and the stock.

Out of scope: money beyond integers, users who talk back (tau-bench's simulated user),
concurrent episodes on one world.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from polyrl.agent.tools import Tool, ToolBox
from polyrl.types import Task

PAGE_SIZE = 5
ORDER_STATUSES = ("pending", "delivered", "refunded", "cancelled")
BOOKING_STATUSES = ("active", "cancelled")


class ServiceBusy(Exception):
    """A transient failure: the same call later goes through."""


class NeedsApproval(Exception):
    """A refund or cancellation over the approval limit, before `approve(ref)`."""


@dataclass
class World:
    orders: dict[str, dict[str, Any]]
    """id -> {customer, item, qty, total, status, promised_day, delivered_day (None while pending), refunded}"""
    bookings: dict[str, dict[str, Any]]
    """id -> {customer, day, deposit, status, refunded}"""
    stock: dict[str, int]
    """item -> units"""
    approval_limit: int = 100
    """refunds and cancellations above this many need approve(ref) first"""
    busy: dict[str, int] = field(default_factory=dict)
    """call key -> failures still to come ("service busy")"""
    approvals: list[str] = field(default_factory=list)

    # ---- JSON (task.data["world"]) and the judged state

    def to_json(self) -> dict[str, Any]:
        return copy.deepcopy({"orders": self.orders, "bookings": self.bookings, "stock": self.stock,
                              "approval_limit": self.approval_limit, "busy": self.busy, "approvals": self.approvals})

    @classmethod
    def from_json(cls, data: Any) -> "World":
        """A world from its JSON; ValueError naming the field when it is not one."""
        if not isinstance(data, dict):
            raise ValueError("an ops task's 'world' must be an object")
        try:
            orders = {str(k): _order(v) for k, v in data.get("orders", {}).items()}
            bookings = {str(k): _booking(v) for k, v in data.get("bookings", {}).items()}
            stock = {str(k): int(v) for k, v in data.get("stock", {}).items()}
            busy = {str(k): int(v) for k, v in data.get("busy", {}).items()}
            return cls(orders, bookings, stock, int(data.get("approval_limit", 100)), busy,
                       [str(a) for a in data.get("approvals", [])])
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"an ops task's 'world' is malformed: {type(err).__name__}: {err}") from None

    def state(self) -> dict[str, Any]:
        """What success is judged on: every order's and booking's status and refund, and the stock."""
        return {"orders": {k: {"status": o["status"], "refunded": o["refunded"]}
                           for k, o in sorted(self.orders.items())},
                "bookings": {k: {"status": b["status"], "refunded": b["refunded"]}
                             for k, b in sorted(self.bookings.items())},
                "stock": dict(sorted(self.stock.items()))}

    # ---- failures

    def _attempt(self, key: str) -> None:
        """Raise ServiceBusy while `key` has scheduled failures left (each attempt uses one)."""
        if self.busy.get(key, 0) > 0:
            self.busy[key] -= 1
            raise ServiceBusy(f"service busy ({key.split(':')[0]}), try the same call again")

    def _approved(self, ref: str, amount: int, what: str) -> None:
        if amount > self.approval_limit and ref not in self.approvals:
            raise NeedsApproval(f"{what} of {amount} on {ref} is over the approval limit {self.approval_limit}: "
                                f"call approve(ref={ref}) first")

    # ---- tools

    def list_orders(self, customer: str, page: int = 1) -> str:
        who = customer.strip().lower()
        self._attempt(f"list_orders:{who}:{page}")
        ids = [k for k, o in self.orders.items() if o["customer"] == who]
        return _page(f"orders of {who}", ids, page,
                     lambda k: f"{k} {self.orders[k]['status']} total {self.orders[k]['total']}",
                     f"list_orders(customer={who}, page={page + 1})")

    def get_order(self, order_id: str) -> str:
        ref = _ref(order_id)
        self._attempt(f"get_order:{ref}")
        o = self._order(ref)
        delivered = "not yet" if o["delivered_day"] is None else f"day {o['delivered_day']}"
        return (f"{ref}: customer {o['customer']}, item {o['item']} x{o['qty']}, total {o['total']}, "
                f"status {o['status']}, promised day {o['promised_day']}, delivered {delivered}, "
                f"refunded {o['refunded']}")

    def refund(self, order_id: str, amount: int) -> str:
        ref = _ref(order_id)
        self._attempt(f"refund:{ref}")
        o = self._order(ref)
        if o["status"] not in ("delivered", "refunded"):
            raise ValueError(f"{ref} is {o['status']}: only delivered orders can be refunded"
                             + (" (cancel a pending order instead)" if o["status"] == "pending" else ""))
        left = o["total"] - o["refunded"]
        if amount <= 0 or amount > left:
            raise ValueError(f"amount must be between 1 and {left}, what is left to refund on {ref}; got {amount}")
        self._approved(ref, amount, "a refund")
        o["refunded"] += amount
        if o["refunded"] == o["total"]:
            o["status"] = "refunded"
        return f"refunded {amount} on {ref} ({o['refunded']} of {o['total']} refunded)"

    def approve(self, ref: str) -> str:
        key = _ref(ref)
        self._attempt(f"approve:{key}")
        if key not in self.orders and key not in self.bookings:
            raise KeyError(f"no order or booking {ref}")
        if key not in self.approvals:
            self.approvals.append(key)
        return f"approved {key}"

    def cancel_order(self, order_id: str) -> str:
        ref = _ref(order_id)
        self._attempt(f"cancel_order:{ref}")
        o = self._order(ref)
        if o["status"] != "pending":
            raise ValueError(f"{ref} is {o['status']}: only pending orders can be cancelled")
        self._approved(ref, o["total"], "a cancellation")
        o["status"] = "cancelled"
        self.stock[o["item"]] = self.stock.get(o["item"], 0) + o["qty"]
        return f"cancelled {ref}; {o['qty']} {o['item']} back in stock"

    def restock(self, item: str, qty: int) -> str:
        name = item.strip().lower()
        self._attempt(f"restock:{name}")
        if name not in self.stock:
            raise KeyError(f"no item {item}")
        if qty <= 0:
            raise ValueError(f"qty must be >= 1, got {qty}")
        self.stock[name] += qty
        return f"{name}: {self.stock[name]} in stock"

    def get_stock(self, item: str) -> str:
        name = item.strip().lower()
        self._attempt(f"get_stock:{name}")
        if name not in self.stock:
            raise KeyError(f"no item {item}")
        return f"{name}: {self.stock[name]} in stock"

    def list_bookings(self, customer: str, page: int = 1) -> str:
        who = customer.strip().lower()
        self._attempt(f"list_bookings:{who}:{page}")
        ids = [k for k, b in self.bookings.items() if b["customer"] == who]
        return _page(f"bookings of {who}", ids, page,
                     lambda k: (f"{k} day {self.bookings[k]['day']} deposit {self.bookings[k]['deposit']} "
                                f"{self.bookings[k]['status']}"),
                     f"list_bookings(customer={who}, page={page + 1})")

    def cancel_booking(self, booking_id: str) -> str:
        ref = _ref(booking_id)
        self._attempt(f"cancel_booking:{ref}")
        if ref not in self.bookings:
            raise KeyError(f"no booking {booking_id}")
        b = self.bookings[ref]
        if b["status"] != "active":
            raise ValueError(f"{ref} is {b['status']}: only active bookings can be cancelled")
        self._approved(ref, b["deposit"], "a cancellation")
        b["status"], b["refunded"] = "cancelled", b["deposit"]
        return f"cancelled {ref}; deposit {b['deposit']} refunded"

    def _order(self, ref: str) -> dict[str, Any]:
        if ref not in self.orders:
            raise KeyError(f"no order {ref}")
        return self.orders[ref]

    def toolbox(self) -> ToolBox:
        def args(**props: tuple[str, str]) -> dict[str, Any]:
            required = [k for k in props if k != "page"]
            return {"type": "object", "properties": {k: {"type": t, "description": d} for k, (t, d) in props.items()},
                    "required": required, "additionalProperties": False}

        customer, page = ("string", "customer name, e.g. ann"), ("integer", "1-based page, default 1")
        order, item = ("string", "order id, e.g. O-1234"), ("string", "item name, e.g. pen")
        limit = self.approval_limit
        return ToolBox([
            Tool("list_orders", f"A customer's orders, {PAGE_SIZE} per page: id, status, total.",
                 args(customer=customer, page=page), self.list_orders),
            Tool("get_order", "One order in full: item, quantity, total, status, promised and delivered days.",
                 args(order_id=order), self.get_order),
            Tool("refund", f"Refund an amount of a delivered order; over {limit} needs approve first.",
                 args(order_id=order, amount=("integer", "amount to refund")), self.refund),
            Tool("approve", f"Approve a refund or cancellation over {limit} on an order or booking.",
                 args(ref=("string", "order or booking id")), self.approve),
            Tool("cancel_order", f"Cancel a pending order (items go back to stock); over {limit} needs approve.",
                 args(order_id=order), self.cancel_order),
            Tool("restock", "Put units of an item back in stock.", args(item=item, qty=("integer", "units")),
                 self.restock),
            Tool("get_stock", "Units of an item in stock.", args(item=item), self.get_stock),
            Tool("list_bookings", f"A customer's bookings, {PAGE_SIZE} per page: id, day, deposit, status.",
                 args(customer=customer, page=page), self.list_bookings),
            Tool("cancel_booking", f"Cancel an active booking (refunds its deposit); over {limit} needs approve.",
                 args(booking_id=("string", "booking id, e.g. B-210")), self.cancel_booking),
        ], state=self.state)


def toolbox_for_task(task: Task) -> ToolBox:
    """Fresh tools over a fresh world of `task` (one per episode), from its JSON data alone."""
    if "world" not in task.data:
        raise ValueError(f"task {task.id!r} has no 'world'; ops tasks carry the world their tools change")
    return World.from_json(task.data["world"]).toolbox()


def call_key(name: str, arguments: dict[str, Any]) -> str:
    """The key of a call in `World.busy`: the tool and what it acts on ("refund:O-1234",
    "list_orders:ann:2", "restock:pen"), as each tool forms it."""
    if name in ("list_orders", "list_bookings"):
        return f"{name}:{str(arguments['customer']).strip().lower()}:{arguments.get('page', 1)}"
    if name in ("restock", "get_stock"):
        return f"{name}:{str(arguments['item']).strip().lower()}"
    ref = next(iter(v for k, v in arguments.items() if k in ("order_id", "booking_id", "ref")))
    return f"{name}:{_ref(ref)}"


def _ref(text: str) -> str:
    return str(text).strip().upper()


def _page(title: str, ids: list[str], page: int, line: Callable[[str], str], next_call: str) -> str:
    if not ids:
        return f"{title}: none"
    pages = math.ceil(len(ids) / PAGE_SIZE)
    if not 1 <= page <= pages:
        raise ValueError(f"page must be between 1 and {pages}, got {page}")
    rows = [line(k) for k in ids[(page - 1) * PAGE_SIZE:page * PAGE_SIZE]]
    tail = [f"next: {next_call}"] if page < pages else []
    return "\n".join([f"{title}, page {page} of {pages}:", *rows, *tail])


def _order(v: dict[str, Any]) -> dict[str, Any]:
    status = str(v["status"])
    if status not in ORDER_STATUSES:
        raise ValueError(f"order status {status!r} is not one of {ORDER_STATUSES}")
    delivered = v.get("delivered_day")
    return {"customer": str(v["customer"]), "item": str(v["item"]), "qty": int(v["qty"]), "total": int(v["total"]),
            "status": status, "promised_day": int(v["promised_day"]),
            "delivered_day": None if delivered is None else int(delivered), "refunded": int(v.get("refunded", 0))}


def _booking(v: dict[str, Any]) -> dict[str, Any]:
    status = str(v["status"])
    if status not in BOOKING_STATUSES:
        raise ValueError(f"booking status {status!r} is not one of {BOOKING_STATUSES}")
    return {"customer": str(v["customer"]), "day": int(v["day"]), "deposit": int(v["deposit"]), "status": status,
            "refunded": int(v.get("refunded", 0))}


def apply_changes(state: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`state` with `changes` (the same shape, only what differs) laid over it."""
    out = copy.deepcopy(state)
    for section, entries in changes.items():
        for key, value in entries.items():
            if isinstance(value, dict):
                out[section].setdefault(key, {}).update(value)
            else:
                out[section][key] = value
    return out


def state_changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What differs from `before` in `after`, in the shape `apply_changes` takes."""
    out: dict[str, Any] = {}
    for section, entries in after.items():
        for key, value in entries.items():
            old = before.get(section, {}).get(key)
            if isinstance(value, dict):
                diff = {f: v for f, v in value.items() if not isinstance(old, dict) or old.get(f) != v}
                if diff:
                    out.setdefault(section, {})[key] = diff
            elif old != value:
                out.setdefault(section, {})[key] = value
    return out


def state_diff(expected: dict[str, Any], got: dict[str, Any], limit: int = 5) -> list[str]:
    """Up to `limit` differences as 'orders.O-1.refunded: 0, expected 36'."""
    out = []
    for section in sorted(set(expected) | set(got)):
        e, g = expected.get(section, {}), got.get(section, {})
        for key in sorted(set(e) | set(g)):
            ev, gv = e.get(key), g.get(key)
            if isinstance(ev, dict) and isinstance(gv, dict):
                out += [f"{section}.{key}.{f}: {gv.get(f)!r}, expected {ev.get(f)!r}"
                        for f in sorted(set(ev) | set(gv)) if ev.get(f) != gv.get(f)]
            elif ev != gv:
                out.append(f"{section}.{key}: {gv!r}, expected {ev!r}")
    return out[:limit]
