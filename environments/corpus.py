"""Bring your own documents for search: a corpus file becomes the knowledge base the search tool
retrieves from, in place of the generated world.

    data.corpus_file: examples/search/corpus.jsonl    (JSONL, .jsonl.gz or Parquet; local or s3://)

One document per row:

    id     str or int, unique, non-empty
    title  str, optional (the tool shows it before the text when the text does not name it)
    text   str, non-empty

Search-R1's corpus rows ({"id", "contents": "\\"Title\\"\\ntext"}) are read too. Every bad row is
reported with the file, the row and the field, and nothing is indexed until the whole file is
clean. Questions over the corpus come from `data.task_file` in the question-file shape
(environments/task_files.py: question + golden_answers, the Search-R1 / NQ / HotpotQA form).
"""

from __future__ import annotations

import json

from environments.task_files import TaskFileError, _summary, read_rows

DOCUMENT_TYPE = "document"  # the knowledge base's entity type of a corpus row
MAX_TEXT_CHARS = 20_000


def _split_contents(contents: str) -> tuple[str, str]:
    """Search-R1's `contents`: the title in quotes on the first line, then the text."""
    first, _, rest = contents.partition("\n")
    return first.strip().strip('"'), rest.strip()


def _document(row: dict) -> tuple[dict | None, list[str]]:
    number = row["_row"]
    problems = []
    doc_id = row.get("id", row.get("doc_id"))
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or not str(doc_id).strip():
        problems.append(f"row {number}: field 'id': expected a non-empty string or integer, got {doc_id!r}")
    if "text" not in row and isinstance(row.get("contents"), str):
        title, text = _split_contents(row["contents"])
    else:
        title, text = row.get("title", ""), row.get("text")
    if title is None or (isinstance(title, float) and title != title):  # Parquet's missing value
        title = ""
    if not isinstance(title, str):
        problems.append(f"row {number}: field 'title': expected text, got {title!r:.60}")
    if not isinstance(text, str) or not text.strip():
        problems.append(f"row {number}: field 'text': expected non-empty text, got {text!r:.60}")
    elif len(text) > MAX_TEXT_CHARS:
        problems.append(
            f"row {number}: field 'text': {len(text)} characters > {MAX_TEXT_CHARS} (split long documents into passages)"
        )
    if problems:
        return None, problems
    return {"doc_id": str(doc_id), "title": title.strip(), "text": " ".join(text.split())}, []


def load_corpus(path: str) -> list[dict]:
    """The file's documents as {"doc_id", "title", "text"}, or TaskFileError naming every bad row."""
    documents, problems, seen = [], [], {}
    for row in read_rows(path, "corpus file"):
        document, bad = _document(row)
        if bad:
            problems += bad
        elif document["doc_id"] in seen:
            problems.append(
                f"row {row['_row']}: field 'id': {document['doc_id']!r} repeats row {seen[document['doc_id']]}"
            )
        else:
            seen[document["doc_id"]] = row["_row"]
            documents.append(document)
    if problems:
        raise TaskFileError(_summary(path, problems, "corpus file"))
    if not documents:
        raise TaskFileError(f"corpus file {path}: no documents")
    return documents


def corpus_kb_rows(documents: list[dict]) -> list[dict]:
    """The knowledge_base asset's rows for a corpus: one entity per document, no relations."""
    return [
        {
            "name": d["doc_id"],
            "type": DOCUMENT_TYPE,
            "relations": json.dumps({}),
            "doc_id": d["doc_id"],
            "title": d["title"],
            "text": d["text"],
        }
        for d in documents
    ]
