"""What the search tool retrieves with: a `Retriever` over passages, BM25 (bm25s) by default.

    retriever = BM25Retriever.build(passages)         # or BM25Retriever.load(folder)
    ids, scores = retriever.retrieve(["Tavo Relu"], k=3)   # per query: passage indexes, best first
    retriever.save(folder)                            # the `search_index` asset's folder

A retriever returns, for each query, up to k (passage index, score) pairs with score > 0 meaning
"matched something". SearchTool formats the passages; nothing else depends on BM25. A dense
retriever is another class with the same three methods (docs/task-families.md says what it takes:
an embedding model in the config, passages embedded once by the `search_index` asset, queries
embedded per call, inner-product top-k, and a score threshold in place of BM25's "no term matched").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol, Sequence

MANIFEST = "retriever.json"


class Retriever(Protocol):
    kind: str
    size: int  # passages indexed

    def retrieve(self, queries: Sequence[str], k: int) -> tuple[list[list[int]], list[list[float]]]: ...

    def save(self, folder: Path) -> None: ...


def _tokenize(texts: Sequence[str]) -> list[list[str]]:
    import bm25s  # lazy: tasks and the teacher import without the retriever

    # Strings, not ids: retrieve() maps them through the index's vocabulary and ignores unknowns.
    return bm25s.tokenize(list(texts), stopwords="en", show_progress=False, return_ids=False)


class BM25Retriever:
    """bm25s's BM25 (Lucene's scoring), English stopwords, no stemming."""

    kind = "bm25"

    def __init__(self, index, size: int, terms: list[int] | None = None) -> None:
        self.index, self.size = index, size
        self.terms = terms  # indexed terms per passage, when built here (not kept by save/load)

    @classmethod
    def build(cls, passages: Sequence[str]) -> "BM25Retriever":
        import bm25s

        if not passages:
            raise ValueError("a retriever needs at least one passage")
        tokens = _tokenize(passages)
        index = bm25s.BM25()
        index.index(tokens, show_progress=False)
        return cls(index, len(passages), [len(t) for t in tokens])

    def retrieve(self, queries: Sequence[str], k: int) -> tuple[list[list[int]], list[list[float]]]:
        ids, scores = self.index.retrieve(_tokenize(queries), k=min(k, self.size), show_progress=False)
        return [list(map(int, row)) for row in ids], [list(map(float, row)) for row in scores]

    def vocabulary_size(self) -> int:
        return len(self.index.vocab_dict)

    def save(self, folder: Path) -> None:
        self.index.save(str(folder))
        (Path(folder) / MANIFEST).write_text(json.dumps({"kind": self.kind, "size": self.size}))

    @classmethod
    def load(cls, folder: Path) -> "BM25Retriever":
        import bm25s

        info = json.loads((Path(folder) / MANIFEST).read_text())
        return cls(bm25s.BM25.load(str(folder)), int(info["size"]))


RETRIEVERS = {"bm25": BM25Retriever}


def load_retriever(folder: Path) -> Retriever:
    kind = json.loads((Path(folder) / MANIFEST).read_text())["kind"]
    if kind not in RETRIEVERS:
        raise ValueError(f"{folder}: retriever kind {kind!r} is not one of {sorted(RETRIEVERS)}")
    return RETRIEVERS[kind].load(folder)
