"""Memory patterns: episodic, shared, hierarchical, RAG, fact memory, cross-thread recall.

See DESIGN.md.

Every pattern works with no arguments and composes on top of the conversation memory;
``MemoryManager`` builds them per agent from the ``patterns:`` section of a config file.
"""

from marsys_mem.patterns.episodic import Episode, EpisodeMatch, EpisodicMemory
from marsys_mem.patterns.extraction import (
    ExtractionPipeline,
    ExtractionStats,
    FactExtractor,
    extract_facts_offline,
    is_trivial,
)
from marsys_mem.patterns.hierarchical import HierarchicalMemory, Tier
from marsys_mem.patterns.importance import default_importance
from marsys_mem.patterns.rag import Fusion, Ingest, RAGMemory, Ranking, ScoredMessage, SearchMode
from marsys_mem.patterns.shared import ConflictRule, SharedMemoryPool
from marsys_mem.patterns.threads import CrossThreadRecall, ThreadHit
from marsys_mem.patterns.user_facts import (
    Fact,
    FactCandidate,
    FactCategory,
    FactChange,
    FactMemory,
    MaintenanceReport,
    ScoredFact,
)
from marsys_mem.retrieval.bm25 import BM25Index

__all__ = [
    "BM25Index",
    "ConflictRule",
    "CrossThreadRecall",
    "Episode",
    "EpisodeMatch",
    "EpisodicMemory",
    "ExtractionPipeline",
    "ExtractionStats",
    "Fact",
    "FactCandidate",
    "FactCategory",
    "FactChange",
    "FactExtractor",
    "FactMemory",
    "Fusion",
    "HierarchicalMemory",
    "Ingest",
    "MaintenanceReport",
    "RAGMemory",
    "Ranking",
    "ScoredFact",
    "ScoredMessage",
    "SearchMode",
    "SharedMemoryPool",
    "ThreadHit",
    "Tier",
    "default_importance",
    "extract_facts_offline",
    "is_trivial",
]
