"""Task families and their tools: arithmetic and code with the interpreter, search with BM25.

Each family is one module registering a `TaskFamily` (environments/family.py); importing this
package registers the built-in three.
"""

from environments import arithmetic, code, search  # noqa: F401  (register the built-in families)
