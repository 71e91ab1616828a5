"""The chat example's model pool in process, on its echo backend: each reply is counted by
how it ended."""

from __future__ import annotations

from typing import cast

import pytest

from app_toolkit._runtime.replica.user_code import run_destructor
from app_toolkit.llm import EngineStopped
from examples.chat.chat.model import ChatModel
from examples.chat.chat.schemas import Generation
from examples.chat.chat.settings import Settings
from tests.deployments import as_deployment

pytestmark = pytest.mark.anyio


async def test_a_reply_whose_engine_stops_under_it_counts_as_stopped_not_failed() -> None:
    """The replica stops (its ``__del__`` closes the engine) mid-reply: the reply ends with
    ``EngineStopped``, which its caller continues elsewhere; it is no failure of the model."""
    built = as_deployment(ChatModel).func_or_class  # the class under @tk.deployment
    model = cast(ChatModel, built(Settings(backend="echo", echo_tokens_per_s=1000, _env_file=None)))
    generation = Generation(messages=(("user", "one two three four five six"),), max_tokens=50)
    replies = model.generate(generation)
    assert (await anext(replies)).prompt_tokens
    assert (await anext(replies)).text  # the first word
    await run_destructor(model, 5)  # as the replica stops: its __del__, once
    with pytest.raises(EngineStopped):
        async for _ in replies:
            pass
    assert model._replies == {"started": 1, "finished": 0, "stopped": 1, "failed": 0}
