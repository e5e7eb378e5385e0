"""An OpenAI Agents SDK agent whose history lives in marsys-mem (MarsysSession).

    python examples/agents_sdk/session_demo.py [--store DIR]

Two runs share one session (the second sees the first's tool call), the history survives a
new MemoryManager on the same SQLite file (a restart), and ``limit`` never splits a tool
call from its output. With ``OPENAI_API_KEY`` set the agent talks to a real model
(``--model``, default gpt-4.1-mini); without it, a scripted model plays the same turns
offline, so the example runs anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    Model,
    ModelResponse,
    RunConfig,
    Runner,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.memory import SessionSettings
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from marsys_mem import MemoryManager
from marsys_mem.config import MemoryConfig
from marsys_mem.integrations.agents import MarsysSession


@function_tool
def weather(city: str) -> str:
    """The current weather in a city.

    Args:
        city: the city.
    """
    return {"tokyo": "21C, clear", "oslo": "-3C, snow"}.get(city.lower(), "15C, cloudy")


class ScriptedModel(Model):
    """Plays prepared turns (Responses output items) in order: the offline stand-in."""

    def __init__(self) -> None:
        self.turns: list[list[Any]] = [
            [_call("call_1", "weather", {"city": "Tokyo"})],
            [_say("msg_1", "Tokyo: 21C and clear.")],
            [_say("msg_2", "You asked about Tokyo: 21C and clear.")],
        ]

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """The next prepared turn."""
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        """Not used here (the example does not stream)."""
        raise NotImplementedError


def _say(item_id: str, text: str) -> ResponseOutputMessage:
    part = ResponseOutputText(type="output_text", text=text, annotations=[])
    return ResponseOutputMessage(
        id=item_id,
        type="message",
        role="assistant",
        status="completed",
        content=[part],
    )


def _call(call_id: str, name: str, args: dict[str, Any]) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id="fc_" + call_id,
        type="function_call",
        call_id=call_id,
        name=name,
        arguments=json.dumps(args),
        status="completed",
    )


def _show(items: list[Any]) -> str:
    shown = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            content = item["content"]
            text = content if isinstance(content, str) else content[0].get("text", "")
            shown.append(f"{item['role']}: {text[:50]}")
        else:
            shown.append(f"{kind}({item.get('call_id')})")
    return "\n     ".join(shown)


async def main(store: Path, model_name: str) -> None:
    """Two runs on one session, with a restart (a new MemoryManager) in between."""
    set_tracing_disabled(True)
    config = MemoryConfig.model_validate(
        {
            "store": {"backend": "sqlite", "path": str(store / "memory.db")},
            # persistent: written through to SQLite; at most 10,000 items kept per session
            "agents": {"assistant": {"retention": "persistent", "max_stored_messages": 10000}},
        }
    )
    model: Model | str = model_name if os.environ.get("OPENAI_API_KEY") else ScriptedModel()
    agent = Agent(name="assistant", instructions="Be terse.", model=model, tools=[weather])
    print(f"model: {model_name if isinstance(model, str) else 'scripted (no OPENAI_API_KEY)'}")

    with MemoryManager(config) as manager:
        session = MarsysSession("user-42", manager)
        result = await Runner.run(agent, "What's the weather in Tokyo?", session=session)
        print(f"run 1: {result.final_output}")
        print(f"  stored: {_show(await session.get_items())}")

    # a new manager on the same file: what a restarted process sees
    with MemoryManager(config) as manager:
        session = MarsysSession("user-42", manager)
        print(
            f"after restart, limit=2 (the call comes with its output):\n     "
            f"{_show(await session.get_items(limit=2))}"
        )
        settings = RunConfig(session_settings=SessionSettings(limit=2))
        result = await Runner.run(
            agent, "Which city did I ask about?", session=session, run_config=settings
        )
        print(f"run 2: {result.final_output}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, help="folder for the SQLite store (default: temp)")
    parser.add_argument("--model", default="gpt-4.1-mini", help="with OPENAI_API_KEY set")
    args = parser.parse_args()
    if args.store is not None:
        asyncio.run(main(args.store, args.model))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(main(Path(tmp), args.model))
