"""A complete chat loop: memory window in, answer out, facts learned in the background.

Talks to any OpenAI-compatible server through the official ``openai`` SDK (OpenAILLM):
``OPENAI_BASE_URL`` (default: Ollama on localhost), ``OPENAI_MODEL`` (default ``llama3.2``).
With no model at hand, ``python -m marsys_mem.testing.llm_server`` serves a scripted echo
model on loopback and prints the variables to export. Needs ``marsys-mem[openai]``.
"""

import os

from marsys_mem import ContextPolicy, ConversationMemory, Message
from marsys_mem.llm.openai import OpenAILLM
from marsys_mem.patterns import ExtractionPipeline, FactMemory

base_url = os.environ.get("OPENAI_BASE_URL", "http://localhost:11434/v1")
llm = OpenAILLM(os.environ.get("OPENAI_MODEL", "llama3.2"), base_url=base_url, timeout=60)
mem = ConversationMemory([Message.system("You are a helpful, terse assistant.")])
facts = FactMemory()  # packaged MiniLM (else a hashing embedder); store=... to keep them
policy = ContextPolicy(max_tokens=4000)
turns = ["Hi! My name is Ana and I live in Porto.", "I love green tea.", "ok",
         "I'm moving to Lisbon next month.", "Where do I live, and what do I like?"]
with ExtractionPipeline(facts, "ana", debounce=0.5) as learn:  # a background thread
    for text in turns:
        question = Message.user(text)
        mem.add(question)
        known = [h.text for h in facts.search(text, k=3, min_score=0.3, subject="ana")]
        window = mem.context(policy).messages                     # the bounded window in
        notes = [Message.system("Known about the user: " + "; ".join(known))] if known else []
        answer = llm.reply([*window[:1], *notes, *window[1:]])    # the answer out
        mem.add(answer)
        learn.submit([question, answer])                          # never waits for extraction
        print(f"> {text}\n{answer.text}")
print("learned:", [f.text for f in facts.facts("ana")], learn.stats)
llm.close()
