"""Errors a request can end in, as OpenAI's error object.

Every way a request fails becomes `{"error": {"message", "type", "param", "code"}}` with an
HTTP status: 400 for a bad request (never a 5xx: OpenAI's client retries those, tripling the
load), 401 for a missing key, 404 for an unknown model or route, 409 for a stale weight
version, 429 when a tier's queue is full, 500 for a bug (its message names the exception
class; the traceback goes to the server's log, never to the client).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class APIError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def queue_full(tier: str, limit: int) -> APIError:
    return APIError(429, f"the {tier} tier has {limit} requests in flight, its limit; retry shortly",
                    "rate_limit_error", None, "queue_full")
