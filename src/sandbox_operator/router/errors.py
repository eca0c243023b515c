"""What the router answers instead of forwarding: a status code and a reason a caller branches
on. Its own module because every stage (target, head, reviews, view, wake) refuses with it, and
the server turns it into the one answer shape. A message names the field or the state, never a
token, an address or a pod."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal(Exception):
    """A request the router answers itself, before (or instead of) forwarding anything."""

    status: int
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}"


def bad_request(message: str) -> Refusal:
    return Refusal(400, "BadRequest", message)
