"""A real labelled text set that ships offline: Debian's fortunes, each quotation labelled by the file it is in.

The files of the Debian package `fortunes` (BSD fortune's collection: quotations, jokes and verse people wrote,
one file per topic, entries between lines of a lone '%') are read from /usr/share/games/fortunes when the
package is installed, and otherwise from the package itself, fetched with `apt-get download` and unpacked with
`dpkg -x` into a temporary folder (nothing installed). The default topics, computers, politics, science and
songs-poems, give 3,099 texts of 10 to 1,778 characters (median 126); a text found under two topics is left out.
"""

from __future__ import annotations

import csv
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.debian, beside bench/
from tests import debian

INSTALLED = Path("/usr/share/games/fortunes")
TOPICS = ("computers", "politics", "science", "songs-poems")


def write_csv(path: Path, topics: tuple[str, ...] = TOPICS) -> int:
    """The topics' fortunes as a text,label CSV at path; how many rows it has."""
    if all((INSTALLED / topic).is_file() for topic in topics):
        found = _read(INSTALLED, topics)
    else:
        with tempfile.TemporaryDirectory(prefix="fortunes-") as folder:
            root = debian.unpacked(("fortunes", "fortunes-min"), Path(folder))
            found = _read(root / INSTALLED.relative_to("/"), topics)
    topics_of: dict[str, set[str]] = {}
    for text, topic in found:
        topics_of.setdefault(text, set()).add(topic)
    rows = [(text, topic) for text, topic in found if len(topics_of[text]) == 1]
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return len(rows)


def _read(folder: Path, topics: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(entry.strip(), topic) for topic in topics
            for entry in (folder / topic).read_text(encoding="utf-8").split("\n%\n") if entry.strip()]
