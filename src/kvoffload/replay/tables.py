"""Report tables of `kvoffload replay`, rendered to fit a width (80 columns in files).

A report's table is text cells (`ReportTable`); rendering picks the style. A table
wider than the width is split into parts of whole columns, each repeating the
key columns that say which run a row is, as wide data frames are printed in
blocks; a cell wider than the whole width folds onto more lines, never cut off.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TextIO

from rich import box
from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

REPORT_WIDTH = 80
"""Columns of the tables written to report files, and off a terminal by default."""
GAP = 2
"""Spaces between two columns."""


@dataclass(frozen=True)
class ReportTable:
    """A titled table of text cells. Its first `keys` columns identify a row. A
    header may hold a newline to take two short lines instead of one long one."""

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    keys: int = 1
    left: int | None = None
    """Leading columns justified left (default: the key columns); the others,
    figures, are justified right."""

    def __post_init__(self) -> None:
        assert 0 < self.keys <= len(self.headers)
        assert self.left is None or 0 <= self.left <= len(self.headers)
        assert all(len(row) == len(self.headers) for row in self.rows)

    def widths(self) -> list[int]:
        """Each column's natural width: its widest header line or cell."""
        return [
            max(
                [cell_len(line) for line in header.split("\n")]
                + [cell_len(row[i]) for row in self.rows]
            )
            for i, header in enumerate(self.headers)
        ]

    def width(self) -> int:
        """Columns the table takes in one part."""
        widths = self.widths()
        return sum(widths) + GAP * (len(widths) - 1)

    def column_parts(self, width: int) -> list[list[int]]:
        """Indices of the columns of each part: the key columns, then the others
        in order, in as few parts as fit in `width` (at least one column a part),
        as even in width as they can be (not a last part of one column)."""
        widths = self.widths()
        parts = self._pack(widths, width)
        if len(parts) > 1:
            # The narrowest limit that still needs no more parts.
            others = range(self.keys, len(widths))
            low = min(width, max(self._part_width(widths, [i]) for i in others))
            high = width
            while low < high:
                middle = (low + high) // 2
                if len(self._pack(widths, middle)) <= len(parts):
                    high = middle
                else:
                    low = middle + 1
            parts = self._pack(widths, high)
        keys = list(range(self.keys))
        return [keys + part for part in parts]

    def _part_width(self, widths: Sequence[int], columns: Sequence[int]) -> int:
        """Columns a part of the key columns and `columns` takes."""
        keys = sum(widths[: self.keys]) + GAP * (self.keys - 1)
        return keys + sum(GAP + widths[i] for i in columns)

    def _pack(self, widths: Sequence[int], width: int) -> list[list[int]]:
        """The non-key columns in order, as many a part as fit in `width`."""
        parts: list[list[int]] = [[]]
        for i in range(self.keys, len(widths)):
            if parts[-1] and self._part_width(widths, [*parts[-1], i]) > width:
                parts.append([])
            parts[-1].append(i)
        return parts

    def render(self, width: int) -> list[RenderableType]:
        """The title and the table, in as many parts as `width` needs."""
        out: list[RenderableType] = []
        for n, columns in enumerate(self.column_parts(width)):
            out.append(Text(self.title if n == 0 else "(continued)"))
            out.append(self._table(columns))
        return out

    def _table(self, columns: Sequence[int]) -> Table:
        table = Table(
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            padding=(0, 1, 0, 0),  # with the column divider: GAP spaces
        )
        left = self.keys if self.left is None else self.left
        for i in columns:
            table.add_column(
                self.headers[i],
                justify="left" if i < left else "right",
                overflow="fold",
            )
        for row in self.rows:
            table.add_row(*(row[i] for i in columns))
        return table


def print_tables(console: Console, tables: Iterable[ReportTable]) -> None:
    """Each table at the console's width, a blank line after each part."""
    for table in tables:
        for item in table.render(console.width):
            console.print(item)
            if isinstance(item, Table):
                console.print()


def write_tables(
    out: TextIO, tables: Iterable[ReportTable], width: int = REPORT_WIDTH
) -> None:
    """The tables as plain text, `width` columns wide (a report file)."""
    print_tables(Console(file=out, width=width, color_system=None), tables)
