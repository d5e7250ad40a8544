"""Runtime backends: one small interface (numpy in, numpy out), one file per backend.

They live under models/ rather than server/ because ``distilserve export`` checks every
artifact it writes with the very code that will serve it.
"""

from distilserve.models.runtime.base import Backend
from distilserve.models.runtime.selection import open_backend

__all__ = ["Backend", "open_backend"]
