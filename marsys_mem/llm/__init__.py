"""LLM adapters: one small completion protocol over the official ``openai`` and ``anthropic`` SDKs.

Everything in marsys-mem that needs a model (summariser, fact extractor) takes a plain
callable; these adapters are such callables. Independent of stores and retrieval.
"""

__all__: list[str] = []
