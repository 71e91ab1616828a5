"""A deployment: built once per replica, called through a handle from the routes."""

from __future__ import annotations

import app_toolkit as tk


@tk.deployment(num_replicas=1, max_ongoing_requests=32)
class Greeter:
    def __init__(self, greeting: str) -> None:
        self.greeting = greeting  # load models or open connections here, once per replica
        self.greeted = 0

    async def greet(self, name: str) -> str:
        self.greeted += 1
        return f"{self.greeting}, {name}!"

    async def count(self) -> int:
        return self.greeted
