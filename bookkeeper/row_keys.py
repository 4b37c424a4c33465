"""Primary-key values -> the 128-bit words the key
index stores, and reading them from Parquet files.

A single integer key (INT, BIGINT: most source tables) is stored as itself, exactly. Any other key
(strings, composites, decimals, dates) is hashed with BLAKE2b to 128 bits over a canonical text of
its values: the chance that two of 10^9 live keys collide is about 10^-21, where a 64-bit hash
would collide once in ~10^5 tables of 10M keys, and a collision would delete another key's row.
The canonical text is `repr` of the tuple of Python values, which is the same for a key read from
a data file and from a deleted-keys file, and survives Iceberg's type promotions (int -> long,
float -> double, wider decimal precision keep their values).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType

from icekeeper.common.delete_files import read_columns_by_id


def exact_keys(schema: Schema) -> bool:
    """True when the table's key is one integer column, which the index stores as itself."""
    key_ids = list(schema.identifier_field_ids)
    return len(key_ids) == 1 and isinstance(
        schema.find_field(key_ids[0]).field_type, (IntegerType, LongType)
    )


def key_words(
    columns: list[pa.ChunkedArray | pa.Array], exact: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) words of each row's key, given the key columns in the table's key order."""
    rows = len(columns[0]) if columns else 0
    if exact:
        values = pc.cast(columns[0], pa.int64())
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        return values.to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64), np.zeros(
            rows, np.uint64
        )
    # Hashing in Python (~1.5 µs a key): pyarrow has no public hash kernel, and the hashes of
    # DuckDB and polars may change between their versions, while these are persisted.
    values = zip(*[column.to_pylist() for column in columns])
    digests = b"".join(
        hashlib.blake2b(repr(key).encode(), digest_size=16).digest() for key in values
    )
    words = np.frombuffer(digests, dtype=">u8").astype(np.uint64).reshape(rows, 2)
    return words[:, 0].copy(), words[:, 1].copy()


def file_key_words(path: str, key_ids: list[int], exact: bool) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) of every row of file `path`, in row order (row positions are the array indexes)."""
    return key_words(read_columns_by_id(path, key_ids), exact)
