"""What each test file costs, for ordering the parallel suite (tests/conftest.py).

`make test` runs the whole suite in one pytest session on 2 xdist workers, a file (or a
file group) at a time per worker.  The two workers finish together only if the costly
files start first and the cheap ones fill in at the end, so the scheduler takes the
files in the order of tests/durations.json: worker-seconds per file, measured.  The
numbers order the work and nothing else: a stale or missing entry costs minutes at the
end of the run, never a test.

    python -m pytest -n 2 --junitxml=/tmp/suite.xml tests     # any subset, any machine
    python tests/durations.py /tmp/suite.xml [more.xml ...]    # rewrites durations.json

Files a report does not cover keep their old entries.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

TABLE = Path(__file__).with_name("durations.json")


def load() -> dict[str, float]:
    """File name -> worker-seconds; empty if the table is missing or unreadable."""
    try:
        table = json.loads(TABLE.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in table.get("seconds", {}).items()}


def from_junit(paths: list[str]) -> dict[str, float]:
    """Sum every test case's time (setup, call and teardown) by its file's name."""
    seconds: Counter = Counter()
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            module = case.get("classname", "").split(".")
            if len(module) >= 2 and module[0] == "tests":
                seconds[module[1] + ".py"] += float(case.get("time") or 0.0)
    return dict(seconds)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    table = load()
    table.update({name: round(s, 1) for name, s in from_junit(argv).items()})
    TABLE.write_text(json.dumps({
        "about": "worker-seconds per test file, to start the costly ones first "
                 "(tests/durations.py)",
        "seconds": dict(sorted(table.items(), key=lambda kv: -kv[1])),
    }, indent=1) + "\n")
    print(f"{TABLE}: {len(table)} files, {sum(table.values()):,.0f} worker-seconds")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
