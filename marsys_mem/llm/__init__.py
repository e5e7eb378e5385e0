"""LLM adapters: one small completion protocol over the official ``openai`` and ``anthropic`` SDKs.

Everything in marsys-mem that needs a model (summariser, fact extractor) takes a plain
callable; these adapters are such callables. Independent of stores and retrieval.

The protocol, :class:`LLM`: ``complete(messages, schema=None)`` returns text, or an instance
of a pydantic model ``schema`` (structured output, validated, one retry on invalid JSON);
``acomplete`` is its async twin. The adapters live in their own modules, which import their
SDK: :class:`marsys_mem.llm.openai.OpenAILLM` (extra ``openai``: OpenAI, Azure, and any
OpenAI-compatible server by ``base_url``) and :class:`marsys_mem.llm.anthropic.AnthropicLLM`
(extra ``anthropic``). :class:`LLMSummarizer` / :class:`AsyncLLMSummarizer` turn any of them
into a summariser for ``ContextPolicy(strategy="summarize")``. :func:`make_llm` builds the
adapter an ``llm:`` section of a config file describes (:func:`llm_problems` says what
would stop it: a missing SDK extra, an unset key variable).
"""

from marsys_mem.llm.base import LLM, LLMSettings, Prompt, StructuredMode
from marsys_mem.llm.factory import LLMSpec, llm_problems, make_llm
from marsys_mem.llm.summarize import AsyncLLMSummarizer, LLMSummarizer

__all__ = [
    "LLM",
    "AsyncLLMSummarizer",
    "LLMSettings",
    "LLMSpec",
    "LLMSummarizer",
    "Prompt",
    "StructuredMode",
    "llm_problems",
    "make_llm",
]
