"""Print one closing line for several pytest runs (``make test``'s unit, cluster and maf runs).

CI reads the whole run's verdict from pytest's closing line and the exit code; with three runs
the last closing line printed would be only the last run's, so a failure in an earlier run could
end under a green line. This sums the runs' closing lines (from their logs) into one line in
pytest's words, printed last; a run whose log has no closing line counts as one error.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

CLOSING = re.compile(r"^=+ (?P<body>.*\d+ \w+.* in [\d.]+s.*?) =+$")
COUNT = re.compile(r"(\d+) (\w+)")
SECONDS = re.compile(r" in ([\d.]+)s")
ORDER = ("failed", "passed", "skipped", "deselected", "xfailed", "xpassed", "warnings", "errors")


def _word(word: str, count: int) -> str:
    """pytest's words: "1 error", "2 errors", "1 warning"."""
    return word[:-1] if count == 1 and word in ("errors", "warnings") else word


def main(logs: list[str], *, drop: frozenset[str] = frozenset()) -> int:
    """Print the runs' summed closing line; ``drop``: words not summed (the two parts of the
    cluster run split it by a marker, so each deselects what the other runs)."""
    counts: dict[str, int] = {}
    seconds = 0.0
    for log in logs:
        lines = Path(log).read_text(errors="replace").splitlines() if Path(log).exists() else []
        closing = next((m for line in reversed(lines) if (m := CLOSING.match(line))), None)
        if closing is None:
            counts["errors"] = counts.get("errors", 0) + 1
            print(f"{log}: no pytest closing line (the run did not finish)", file=sys.stderr)
            continue
        body = closing["body"]
        for number, word in COUNT.findall(body.split(" in ")[0]):
            word = {"error": "errors", "warning": "warnings"}.get(word, word)
            if word not in drop:
                counts[word] = counts.get(word, 0) + int(number)
        if found := SECONDS.search(body):
            seconds += float(found[1])
    words = sorted(counts, key=lambda w: ORDER.index(w) if w in ORDER else len(ORDER))
    summary = ", ".join(f"{counts[w]} {_word(w, counts[w])}" for w in words) or "no tests ran"
    print(f"{'=' * 20} {summary} in {seconds:.2f}s (all runs) {'=' * 20}")
    return 1 if counts.get("failed") or counts.get("errors") else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    dropped = frozenset(a.removeprefix("--drop=") for a in args if a.startswith("--drop="))
    sys.exit(main([a for a in args if not a.startswith("--drop=")], drop=dropped))
