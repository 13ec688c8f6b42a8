"""pyarrow, imported in one place: it ships no type information, so mypy sees these as ``Any``."""

import pyarrow as pa  # type: ignore[import-untyped,import-not-found,unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped,import-not-found,unused-ignore]
import pyarrow.json as pj  # type: ignore[import-untyped,import-not-found,unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped,import-not-found,unused-ignore]

__all__ = ["pa", "pc", "pj", "pq"]
