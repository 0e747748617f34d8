"""Ids and times of the service's messages."""

from __future__ import annotations

import os
import time
import uuid

from google.protobuf import timestamp_pb2


def timestamp(ms: int) -> timestamp_pb2.Timestamp:
    """Unix milliseconds as a Timestamp."""
    stamp = timestamp_pb2.Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


def uuid7() -> str:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then random bits; sorts by creation time."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10))
    value = (millis & (2**48 - 1)) << 80 | 0x7 << 76 | (rand >> 68) << 64 | 0b10 << 62 | rand & (2**62 - 1)
    return str(uuid.UUID(int=value))
