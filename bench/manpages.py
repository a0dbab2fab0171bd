"""A real labelled set of long texts that ships offline: Linux manual pages, each labelled by its section.

The pages of the Debian packages `manpages` and `manpages-dev` (the Linux man-pages project) are read from
/usr/share/man when the packages are installed, and otherwise from the packages themselves, fetched with
`apt-get download` and unpacked with `dpkg -x` into a temporary folder (nothing installed). The task is to tell a
system call (section 2) from a library function (3) and an overview (7): 2,336 pages (1,667 / 500 / 169) of
about 4,000 to 6,000 characters of source at the median, far longer than a 128-token window, with signal at
both ends (the name and synopsis first; the standards, notes and related pages last). A page that only points
at another (.so) is left out; so is what names the section: the title line and the page's file name. The text
is the page's words as a reader sees them: roff requests dropped, the words of font macros (.B, .BR, ...) kept,
escapes turned into their characters or removed.
"""

from __future__ import annotations

import csv
import gzip
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.debian, beside bench/
from tests import debian

INSTALLED = Path("/usr/share/man")
SECTIONS = {"2": "system call", "3": "library function", "7": "overview"}
PACKAGES = ("manpages", "manpages-dev")
_FONT_MACROS = {"B", "I", "BR", "RB", "BI", "IB", "IR", "RI", "SH", "SS", "SM", "SB", "TP", "IP", "UR", "MT"}
_ESCAPES = [(re.compile(r"\\f(\[[^]]*\]|\(..|.)"), ""), (re.compile(r"\\\((em|en)"), "-"),
            (re.compile(r"\\\(..|\\\[[^]]*\]"), ""), (re.compile(r"\\[-e]"), lambda m: "-" if m[0] == r"\-" else "\\"),
            (re.compile(r"\\[&|^%:]"), ""), (re.compile(r"\\ "), " "), (re.compile(r"\s+"), " ")]


def write_csv(path: Path) -> int:
    """The pages as a text,label CSV at path; how many rows it has."""
    listed = subprocess.run(["dpkg", "-L", *PACKAGES], capture_output=True, text=True, check=False)
    if not listed.returncode:  # installed: their pages among every other package's
        found = _read([Path(line) for line in listed.stdout.splitlines()])
    else:
        with tempfile.TemporaryDirectory(prefix="manpages-") as folder:
            found = _read(list(debian.unpacked(PACKAGES, Path(folder)).rglob("*.gz")))
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["text", "label"])
        writer.writerows(found)
    return len(found)


def _read(paths: list[Path]) -> list[tuple[str, str]]:
    rows = []
    for section, label in SECTIONS.items():
        for page in sorted(path for path in paths if path.parent.name == f"man{section}"
                           and path.name.endswith(f".{section}.gz") and path.is_file() and not path.is_symlink()):
            source = gzip.decompress(page.read_bytes()).decode("utf-8", errors="replace")
            if source.lstrip().startswith(".so "):
                continue
            if text := words(source):
                rows.append((text, label))
    return rows


def words(source: str) -> str:
    """A page's roff source as the words a reader sees."""
    kept = []
    for line in source.splitlines():
        if line.startswith((".", "'")):
            request, _, rest = line[1:].strip().partition(" ")
            if request not in _FONT_MACROS:
                continue  # .TH (which names the section), comments, spacing and the like
            line = rest.replace('"', "")
        kept.append(line)
    text = " ".join(kept)
    for pattern, replacement in _ESCAPES:
        text = pattern.sub(replacement, text)
    return text.strip()
