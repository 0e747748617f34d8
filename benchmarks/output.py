"""What a benchmark prints and saves (a table of its rows, its findings, both in
benchmarks/results/<name>.json), and its command line (`--quick` for a smoke run)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a printed table: its header, the rows' key, its width, and the format of a
    value (`spec`, e.g. ".2f"); headers and values are right-aligned."""

    header: str
    key: str
    width: int
    spec: str = ""


def print_table(columns: Sequence[Column], rows: Iterable[dict[str, Any]]) -> None:
    print(" ".join(f"{c.header:>{c.width}}" for c in columns))
    for r in rows:
        print(" ".join(f"{r[c.key]:>{c.width}{c.spec}}" for c in columns))


def save(name: str, rows: list[dict[str, Any]], findings: list[str]) -> None:
    """benchmarks/results/<name>.json: the rows (each with its payload's size) and the findings."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"rows": rows, "findings": findings}, indent=2))


def publish(name: str, rows: list[dict[str, Any]], findings: list[str]) -> None:
    """Prints the findings, then saves them with the rows (`save`)."""
    for line in findings:
        print(line)
    save(name, rows, findings)


def run_and_publish(
    name: str,
    run: Callable[[bool], list[dict[str, Any]]],
    report: Callable[[list[dict[str, Any]]], list[str]],
    quick: bool,
) -> int:
    """A benchmark's rows (`run`), its table and findings (`report`), with the machine's load
    average before and after the run (a shared machine's figures vary with it), published."""
    before = "load average {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())
    rows = run(quick)
    findings = report(rows)
    findings.append(f"{before} before the run, " + "{:.2f}, {:.2f}, {:.2f} after".format(*os.getloadavg()))
    publish(name, rows, findings)
    return 0


def command(main: Callable[[bool], int], doc: str | None, quick: str) -> NoReturn:
    """Runs a benchmark's `main(quick)` as a command: `--quick` (what `quick` says) for a smoke
    run; the description is the first line of `doc` (the module's)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--quick", action="store_true", help=quick)
    raise SystemExit(main(parser.parse_args().quick))
