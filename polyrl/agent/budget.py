"""TokenBudget: a token allowance that holds under concurrent calls.

A call first reserves what it may use (its prompt tokens plus its max_tokens), and is
made only if the reservation fits beside what is already spent and what other calls
have reserved. Afterwards it commits the tokens it actually used (prompt + completion)
and the rest of the reservation is released. Check-then-increment without the
reservation is how budgets overspend when agents run turns in parallel (LiteLLM
#34732); here the check and the reservation are one step under a lock.

So `spent` never exceeds `limit` as long as each reservation is an upper bound of the
call's usage: exact for the native engine (known prompt ids, max_tokens cap), an
estimate for HTTP endpoints, where `overrun` counts the tokens a call used beyond
its reservation.

Milestone alerts (default 50%, 80%, 100% of the limit, on committed tokens) fire once
each, the first time spending reaches them; `commit` returns the ones it crossed and
`on_alert` is called outside the lock.

Units are tokens, weighted: a caller charging a lighter model may pass
`cost_weight * tokens` (see AgentConfig / ModelSlot). Out of scope: money budgets
with price cards (polyrl obs computes cost after the fact), and budgets that refill
over time.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

DEFAULT_MILESTONES = (0.5, 0.8, 1.0)


@dataclass(frozen=True)
class Alert:
    milestone: float
    """Fraction of the limit reached (0.5, 0.8, 1.0)."""
    spent: int
    limit: int


@dataclass
class Reservation:
    id: int
    tokens: int
    open: bool = True


class TokenBudget:
    """A shared allowance of `limit` tokens; `limit=None` is unlimited (accounting only)."""

    def __init__(self, limit: int | None, milestones: Sequence[float] = DEFAULT_MILESTONES,
                 on_alert: Callable[[Alert], None] | None = None):
        if limit is not None and limit <= 0:
            raise ValueError(f"budget limit must be a positive number of tokens or None, got {limit}")
        if any(not 0 < m <= 1 for m in milestones):
            raise ValueError(f"milestones must be fractions in (0, 1], got {list(milestones)}")
        self.limit = limit
        self.milestones = tuple(sorted(set(milestones)))
        self.on_alert = on_alert
        self.spent = 0
        self.reserved = 0
        self.overrun = 0
        """Tokens committed beyond their reservations (estimates that were too low)."""
        self.alerts: list[Alert] = []
        self._fired: set[float] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count()

    @property
    def available(self) -> int | None:
        """Tokens a new reservation may take now; None when unlimited."""
        with self._lock:
            return None if self.limit is None else max(0, self.limit - self.spent - self.reserved)

    @property
    def fraction(self) -> float:
        return 0.0 if self.limit is None else self.spent / self.limit

    def reserve(self, tokens: int) -> Reservation | None:
        """Hold `tokens` for one call, or None when they do not fit (the call must not run)."""
        if tokens < 0:
            raise ValueError(f"cannot reserve {tokens} tokens")
        with self._lock:
            if self.limit is not None and self.spent + self.reserved + tokens > self.limit:
                return None
            self.reserved += tokens
            return Reservation(next(self._ids), tokens)

    def commit(self, reservation: Reservation, used: int) -> list[Alert]:
        """Charge `used` tokens for a reserved call and release its reservation. ValueError for a
        negative or non-integer `used`, and for a reservation already committed or cancelled
        (charging it twice would count one call's tokens twice)."""
        if isinstance(used, bool) or not isinstance(used, int) or used < 0:
            raise ValueError(f"used tokens must be an integer >= 0, got {used!r}")
        with self._lock:
            _close(reservation, "commit")
            self.reserved -= reservation.tokens
            self.spent += used
            self.overrun += max(0, used - reservation.tokens)
            crossed = [] if self.limit is None else [
                Alert(m, self.spent, self.limit) for m in self.milestones
                if m not in self._fired and self.spent >= m * self.limit]
            self._fired.update(a.milestone for a in crossed)
            self.alerts.extend(crossed)
        if self.on_alert is not None:
            for alert in crossed:
                self.on_alert(alert)
        return crossed

    def cancel(self, reservation: Reservation) -> None:
        """Release a reservation whose call did not happen (nothing is charged); ValueError for
        one already committed or cancelled."""
        with self._lock:
            _close(reservation, "cancel")
            self.reserved -= reservation.tokens

    def __repr__(self) -> str:
        return f"TokenBudget(spent={self.spent}, reserved={self.reserved}, limit={self.limit})"


def _close(reservation: Reservation, action: str) -> None:
    """Mark a reservation settled, once (checked and set under the budget's lock, so two threads
    settling one reservation cannot both pass)."""
    if not reservation.open:
        raise ValueError(f"cannot {action} reservation {reservation.id}: it was already committed or cancelled "
                         "(a reservation is settled once)")
    reservation.open = False
