"""A model's server in the test's process on a given engine, and a reply cut after one of
its pieces and continued from the pieces before the cut (``LLMServer.generate`` is
``@continuable``): for tests of continuation on each engine without Ray or HTTP."""

from __future__ import annotations

from collections.abc import Sequence

from app_toolkit.llm import LLMConfig, LLMServer
from app_toolkit.llm.engine import TextEngine
from app_toolkit.llm.events import Delta, Generation
from app_toolkit.llm.replica.continued import continue_generation

#: The server's own configuration: the engine is the test's.
_CONFIG: dict[str, object] = {"model_loading_config": {"model_id": "e"}, "llm_engine": "echo"}


class _Server(LLMServer):
    def __del__(self) -> None:  # type: ignore[override]  # the engine is the test's to close
        pass


async def server_on(engine: TextEngine) -> LLMServer:
    """A model's server whose replies come from ``engine`` (its test closes it)."""
    server = _Server.__new__(_Server)
    await server.__init__(LLMConfig.model_validate(_CONFIG))  # type: ignore[misc]  # an async constructor
    await server._engine.close()
    server._engine = engine
    return server


async def whole(server: LLMServer, generation: Generation) -> list[Delta]:
    """The reply's pieces, unbroken."""
    return [piece async for piece in server.generate(generation)]


async def continued(server: LLMServer, generation: Generation, had: Sequence[Delta]) -> list[Delta]:
    """The pieces ``had`` (the prompt's count first), then the rest of the reply as a
    continuation from them makes it."""
    rest = [piece async for piece in server.generate(continue_generation(generation, had))]
    # The prompt is counted once: no second counting piece (only finishes repeat it).
    assert all(piece.finish_reason is not None or piece.prompt_tokens == 0 for piece in rest)
    return [*had, *rest]


def replies(pieces: Sequence[Delta], count: int) -> list[tuple[object, ...]]:
    """Each of ``count`` choices as its client reads it: text, tool calls, log-probabilities,
    finish, usage and stop reason."""
    made: list[tuple[object, ...]] = []
    for index in range(count):
        mine = [piece for piece in pieces if piece.index == index and piece is not pieces[0]]
        last = [piece for piece in mine if piece.finish_reason is not None]
        assert len(last) == 1  # one finish per choice
        made.append(
            (
                "".join(piece.text for piece in mine),
                [fragment for piece in mine for fragment in piece.tool_calls],
                [logprob for piece in mine for logprob in piece.logprobs],
                last[0].finish_reason,
                last[0].completion_tokens,
                last[0].stop_reason,
            )
        )
    return made
