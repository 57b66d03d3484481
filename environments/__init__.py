"""Task families and their tools: arithmetic and code with the interpreter, search with BM25,
explain (open-ended, judged) with the same search.

Each family is one module registering a `TaskFamily` (environments/family.py); importing this
package registers the built-in four.
"""

from environments import arithmetic, code, explain, search  # noqa: F401  (register the built-in families)
