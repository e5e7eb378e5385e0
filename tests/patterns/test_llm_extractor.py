"""LLMExtractor: the real ``openai`` SDK against the scripted loopback server (no network)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from marsys_mem import Message
from marsys_mem.exceptions import LLMError
from marsys_mem.llm.openai import OpenAILLM
from marsys_mem.patterns.extraction import (
    EXTRACTION_PROMPT,
    ExtractedFacts,
    ExtractionPipeline,
    LLMExtractor,
)
from marsys_mem.patterns.user_facts import FactMemory
from marsys_mem.retrieval.embeddings import HashingEmbedder
from marsys_mem.testing.llm_server import Reply, ScriptedServer, chat_completion, openai_error

ANSWER = {
    "facts": [
        {
            "text": "User lives in Lisbon",
            "category": "identity",
            "slot": "home",
            "confidence": 0.9,
            "sources": [1],
        },
        {
            "text": "User's sister is called Clara",
            "category": "relation",
            "slot": "relation:sister:name",
            "confidence": 0.8,
            "sources": [3, 3, 99],
        },
    ]
}


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as srv:
        yield srv


@pytest.fixture
def llm(server: ScriptedServer) -> Iterator[OpenAILLM]:
    with OpenAILLM("local-model", base_url=f"{server.url}/v1", max_retries=0) as model:
        yield model


def turn() -> list[Message]:
    return [
        Message.user("I moved to Lisbon last spring."),
        Message.assistant("Nice! How do you like it?"),
        Message.user("Love it. Clara, my sister, visits often."),
        Message.user("ok"),
    ]


def test_one_call_with_the_schema_and_numbered_messages(
    server: ScriptedServer, llm: OpenAILLM
) -> None:
    server.queue(Reply(body=chat_completion(json.dumps(ANSWER))))
    messages = turn()
    found = LLMExtractor(llm)(messages)

    [req] = server.requests
    fmt = req.body["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["schema"] == ExtractedFacts.model_json_schema()
    sent = req.body["messages"]
    assert sent[0] == {"role": "system", "content": EXTRACTION_PROMPT}
    # user messages only, numbered by their place in the batch; "ok" is trivial, left out
    assert sent[1]["content"] == (
        '[1] user: "I moved to Lisbon last spring."\n'
        '[3] user: "Love it. Clara, my sister, visits often."'
    )
    assert [(c.text, c.category, c.slot, c.confidence) for c in found] == [
        ("User lives in Lisbon", "identity", "home", 0.9),
        ("User's sister is called Clara", "relation", "relation:sister:name", 0.8),
    ]
    assert found[0].source_ids == (messages[0].message_id,)
    assert found[1].source_ids == (messages[2].message_id,)  # duplicates and 99 ignored
    assert found[1].at == messages[2].timestamp


def test_nothing_to_read_makes_no_call(server: ScriptedServer, llm: OpenAILLM) -> None:
    assert LLMExtractor(llm)([Message.user("thanks!"), Message.assistant("I live in Rome")]) == []
    assert server.requests == []


def test_no_named_source_means_the_whole_batch(server: ScriptedServer, llm: OpenAILLM) -> None:
    server.queue(Reply(body=chat_completion('{"facts": [{"text": "User is a nurse"}]}')))
    messages = [Message.user("I work nights."), Message.user("At the hospital, as a nurse.")]
    [c] = LLMExtractor(llm)(messages)
    assert c.source_ids == tuple(m.message_id for m in messages)
    assert (c.category, c.slot, c.confidence) == ("other", None, 0.7)


def test_malformed_json_is_retried_once_by_the_adapter(
    server: ScriptedServer, llm: OpenAILLM
) -> None:
    server.queue(
        Reply(body=chat_completion('{"facts": [{"text": ')),
        Reply(body=chat_completion(json.dumps(ANSWER))),
    )
    assert len(LLMExtractor(llm)(turn())) == 2
    assert len(server.requests) == 2


async def test_async_twin(server: ScriptedServer) -> None:
    server.queue(Reply(body=chat_completion(json.dumps(ANSWER))))
    async with OpenAILLM("local-model", base_url=f"{server.url}/v1", max_retries=0) as llm:
        found = await LLMExtractor(llm).aextract(turn())
    assert [c.slot for c in found] == ["home", "relation:sister:name"]


def test_pipeline_batches_turns_into_one_call_and_learns(
    server: ScriptedServer, llm: OpenAILLM
) -> None:
    server.queue(Reply(body=chat_completion(json.dumps(ANSWER))))
    facts = FactMemory(HashingEmbedder())
    with ExtractionPipeline(facts, "ana", LLMExtractor(llm), debounce=30) as pipe:
        msgs = turn()
        pipe.submit(msgs[:2])
        pipe.submit(msgs[2:])  # a second turn, same batch
        pipe.flush(timeout=30)
        assert pipe.stats.calls == 1
    assert len(server.requests) == 1
    assert sorted(f.text for f in facts.facts("ana")) == [
        "User lives in Lisbon",
        "User's sister is called Clara",
    ]


def test_server_error_reaches_flush_and_learns_nothing(
    server: ScriptedServer, llm: OpenAILLM
) -> None:
    server.queue(Reply(500, openai_error("boom")))
    facts = FactMemory(HashingEmbedder())
    with ExtractionPipeline(facts, "ana", LLMExtractor(llm), debounce=30) as pipe:
        pipe.submit(turn())
        with pytest.raises(LLMError, match="500"):
            pipe.flush(timeout=30)
        assert pipe.stats.errors == 1
    assert facts.facts("ana") == []


def test_bad_arguments_are_named() -> None:
    with pytest.raises(TypeError, match="llm"):
        LLMExtractor(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="instructions"):
        LLMExtractor(OpenAILLM("m", base_url="http://127.0.0.1:9/v1"), instructions=" ")
    with pytest.raises(ValueError, match="max_facts"):
        LLMExtractor(OpenAILLM("m", base_url="http://127.0.0.1:9/v1"), max_facts=0)
