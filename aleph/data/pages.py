"""The page headers of a parquet column chunk, read before pyarrow decodes a page.

pyarrow allocates what a page header says (a 13 KB file can hold a 400 MiB zstd page) and
decodes a dictionary value once per row that names it (one 64 MiB value in 32 rows: 2 GiB).
`largest_page` walks the chunk's pages the way parquet-cpp does (from the dictionary page or
the first data page, `total_compressed_size` bytes), each header a Thrift compact struct
parsed here with bounded depth and size. A read of k rows decodes at most k + 1 pages (a row
is in one data page, a dictionary value in one page), so k * largest bounds it.
"""

from __future__ import annotations

import os

_HEADER_MAX = 16 << 20  # parquet-cpp's own cap on a page header
_DEPTH_MAX = 16  # nesting a real page header never nears


class BadPage(ValueError):
    """A page header that is not one: its reason."""


class _Short(Exception):
    """The header runs past the bytes read so far."""


class _Compact:
    """A reader of Thrift's compact protocol over `data`, enough to skip any struct."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise _Short
        self.at += 1
        return self.data[self.at - 1]

    def varint(self) -> int:
        out, shift = 0, 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise ValueError("a varint longer than 64 bits")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, kind: int, depth: int) -> None:
        if depth > _DEPTH_MAX:
            raise ValueError("nested deeper than a page header is")
        if kind in (1, 2):  # a bool held in the type nibble
            return
        if kind == 3:
            self.byte()
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.take(8)
        elif kind == 8:
            self.take(self.varint())
        elif kind in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self.byte() if head & 0x0F in (1, 2) else self.skip(head & 0x0F, depth + 1)
        elif kind == 11:
            size = self.varint()
            kinds = self.byte() if size else 0
            for _ in range(size):
                self.skip(kinds >> 4, depth + 1)
                self.skip(kinds & 0x0F, depth + 1)
        elif kind == 12:
            self.fields(depth + 1)
        else:
            raise ValueError(f"Thrift type {kind}")

    def take(self, n: int) -> None:
        if n < 0:
            raise ValueError("a negative length")
        if self.at + n > len(self.data):
            raise _Short
        self.at += n

    def fields(self, depth: int = 0, want: tuple[int, ...] = ()) -> dict[int, int]:
        """Skip a struct to its end; the i32 values of the field ids in `want`."""
        got, last = {}, 0
        while (head := self.byte()) != 0:
            kind, delta = head & 0x0F, head >> 4
            last = last + delta if delta else self.zigzag()
            if last in want and kind == 5:
                got[last] = self.zigzag()
            else:
                self.skip(kind, depth)
        return got


def largest_page(fd: int, start: int, length: int) -> int:
    """Uncompressed bytes of the largest page in bytes [start, start + length) of `fd`;
    BadPage when a header there is not one."""
    largest = 0
    at, end = start, start + length
    while at < end:
        window = 1024
        while True:
            data = os.pread(fd, min(window, end - at), at)
            try:
                c = _Compact(data)
                head = c.fields(want=(2, 3))  # uncompressed, compressed sizes
                break
            except _Short:
                if window >= _HEADER_MAX or len(data) < window:
                    raise BadPage(f"the page header at byte {at:,} is cut short or over "
                                  f"{_HEADER_MAX:,} bytes") from None
                window *= 4
            except ValueError as e:
                raise BadPage(f"the page header at byte {at:,} is not one ({e})") from None
        size, stored = head.get(2), head.get(3)
        if size is None or stored is None or size < 0 or stored < 0:
            raise BadPage(f"the page header at byte {at:,} has no valid sizes")
        largest = max(largest, size)
        at += c.at + stored
    return largest
