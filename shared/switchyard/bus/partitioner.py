"""Kafka's default key partitioner (murmur2), so a key maps to the same partition number
on the in-memory transport as on a Kafka cluster with the same partition count."""

from __future__ import annotations

_MASK_32 = 0xFFFFFFFF
_SEED = 0x9747B28C
_M = 0x5BD1E995


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of ``data`` as an unsigned 32-bit integer.

    Example: ``murmur2(b"21") == 3321034988`` (Java's signed value -973932308).
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK_32
    for i in range(0, length - length % 4, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * _M) & _MASK_32
        k ^= k >> 24
        k = (k * _M) & _MASK_32
        h = ((h * _M) & _MASK_32) ^ k
    tail = length & ~3
    extra = length % 4
    if extra >= 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK_32
    h ^= h >> 13
    h = (h * _M) & _MASK_32
    h ^= h >> 15
    return h


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
