"""Retrieval: embedders, the faiss vector index and its file, background embedding, BM25, fusion.

Independent of stores and patterns; ``RAGMemory`` and ``EpisodicMemory`` compose these parts.
"""

from marsys_mem.retrieval.bm25 import BM25Index
from marsys_mem.retrieval.embeddings import (
    Embedder,
    HashingEmbedder,
    SentenceTransformerEmbedder,
    default_embedder,
)
from marsys_mem.retrieval.index import FaissIndex, VectorIndex
from marsys_mem.retrieval.ingest import EmbeddingQueue
from marsys_mem.retrieval.scoring import Fusion, ScoredMessage, SearchMode

__all__ = [
    "BM25Index",
    "Embedder",
    "EmbeddingQueue",
    "FaissIndex",
    "Fusion",
    "HashingEmbedder",
    "ScoredMessage",
    "SearchMode",
    "SentenceTransformerEmbedder",
    "VectorIndex",
    "default_embedder",
]
