"""The evidence pack on disk: the report files, a manifest of their SHA-256, and its Ed25519 signature.

The manifest is the store's signed one (store/signed.py, with the audit checkpoints' key): verifying needs no
store and no master key, and what vouches for the key besides the pack is a checkpoint exported earlier or a key
given separately.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from appliance.compliance import evidence, render
from appliance.core.errors import EvidenceError
from appliance.core.files import read_file
from appliance.store import Store, anchor, audit, signed
from appliance.store.signed import MANIFEST

FORMAT = "appliance-compliance-pack/1"
ACTION = "compliance.report"
MAX_PACK_FILE = 256 * 2**20  # a pack's report is a summary of a few MiB at most: a larger file is none of it

README = """Compliance evidence pack of appliance store {store_id}, generated {generated_at}.

report.html   the report, for people (self-contained: open it in any browser)
report.json   the same facts, for programs
report.pdf    the report as PDF, where a converter was installed
manifest.json the SHA-256 and size of every file here, and the signing public key
manifest.sig  the Ed25519 signature (hex) over the exact bytes of manifest.json

Check it (offline; no appliance key needed):
  appliance compliance verify DIR [--checkpoint CHECKPOINT.json | --public-key HEX]
or by hand: compare each file's SHA-256 with manifest.json, then verify manifest.sig over
manifest.json with the Ed25519 public key in it.

The public key in a pack proves only that nothing was changed after signing. Trust it by
comparing its SHA-256,
  {fingerprint}
with an audit checkpoint of this appliance kept elsewhere ('appliance audit checkpoint'
signs with the same key) or a key you received separately.
"""


@dataclass(frozen=True)
class Written:
    folder: Path
    files: list[str]
    pdf: str  # which converter made report.pdf, or why there is none
    public_key: str
    audit_head: int | None


@dataclass(frozen=True)
class Checked:
    files: list[str]
    public_key: str
    trusted: str | None  # what vouched for the key, beyond the pack itself
    store_id: str
    generated_at: str


def write(store: Store, folder: Path, actor: str | None = None) -> Written:
    """Collect the facts and write the signed pack into folder (new or empty); the report is audited.

    The files go to a hidden sibling folder that is renamed into place only once the pack is complete and
    its record committed, so a failure leaves nothing that looks like a pack.
    """
    folder = folder.absolute()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise EvidenceError(f"{folder} exists and is not an empty folder",
                            hint="give a new folder with --out; a pack is never written over another")
    if not folder.parent.is_dir():
        raise EvidenceError(f"the folder {folder.parent} does not exist", hint="create it first")
    partial = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(mode=0o700)
    try:
        facts = evidence.collect(store)
        public_key = facts["audit"]["public_key"]
        _write(partial / "report.json", json.dumps(facts, indent=2, default=str).encode() + b"\n")
        _write(partial / "report.html", render.html(facts).encode())
        _write(partial / "README.txt", README.format(store_id=store.store_id, generated_at=facts["generated_at"],
                                                     fingerprint=anchor.fingerprint(public_key)).encode())
        pdf = _pdf(partial / "report.html", partial / "report.pdf")
        head = facts["audit"]["signed_head"]
        files = {path.name: path.read_bytes() for path in sorted(partial.iterdir())}
        manifest = signed.sign(store, files, format=FORMAT, generated_at=facts["generated_at"], audit_head=head)
        for name, data in manifest.items():
            _write(partial / name, data)
        audit.record(store, ACTION, str(folder), actor=actor, files=sorted(files),
                     manifest_sha256=hashlib.sha256(manifest[MANIFEST]).hexdigest(), audit_head=head and head["seq"])
        if folder.exists():
            folder.rmdir()  # empty, checked above
        os.replace(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return Written(folder, sorted(files), pdf, public_key, head and head["seq"])


def verify(folder: Path, public_key: str | None = None, checkpoint: Path | None = None) -> Checked:
    """Check the signature and every file of a pack; EvidenceError naming each thing that fails."""
    files = {path.name: _read(path) for path in sorted(folder.iterdir()) if path.is_file()} if folder.is_dir() else {}
    if not files:
        raise EvidenceError(f"{folder} is not a folder with files", hint="give the folder 'appliance compliance"
                            " report' wrote")
    checked = signed.check(files, kind=FORMAT, noun="pack", error=EvidenceError, public_key=public_key,
                           checkpoint=checkpoint, again="get the pack again from the appliance")
    return Checked(checked.files, checked.public_key, checked.trusted, checked.manifest.get("store_id", "?"),
                   checked.manifest.get("generated_at", "?"))


def _pdf(html: Path, pdf: Path) -> str:
    """Make report.pdf with whichever converter is installed; say which, or that there is none (no dependency)."""
    converter = _pdf_converter()
    if converter is None:
        return "no PDF converter installed (weasyprint, wkhtmltopdf or chromium): report.pdf skipped"
    name, convert = converter
    try:
        convert(html, pdf)
    except (OSError, subprocess.SubprocessError) as exc:
        pdf.unlink(missing_ok=True)
        return f"{name} could not convert the report ({exc}): report.pdf skipped"
    os.chmod(pdf, 0o600)
    return f"report.pdf made with {name}"


def _pdf_converter() -> tuple[str, Callable[[Path, Path], None]] | None:
    if importlib.util.find_spec("weasyprint") is not None:
        def weasy(html: Path, pdf: Path) -> None:
            import weasyprint

            weasyprint.HTML(filename=str(html)).write_pdf(str(pdf))
        return "weasyprint", weasy
    commands: dict[str, Callable[[str, Path, Path], list[str]]] = {
        "wkhtmltopdf": lambda exe, html, pdf: [exe, "--quiet", "--disable-javascript", str(html), str(pdf)],
        "chromium": lambda exe, html, pdf: [exe, "--headless", "--disable-gpu", f"--print-to-pdf={pdf}", html.as_uri()],
        "chromium-browser": lambda exe, html, pdf: [exe, "--headless", "--disable-gpu", f"--print-to-pdf={pdf}",
                                                    html.as_uri()],
    }
    for name, command in commands.items():
        if (exe := shutil.which(name)) is not None:
            return name, lambda html, pdf, exe=exe, command=command: _run(command(exe, html, pdf))
    return None


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=300)


def _write(path: Path, data: bytes) -> None:
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
        file.write(data)


def _read(path: Path) -> bytes:
    """A pack's file, within MAX_PACK_FILE: a folder given to verify may hold anything, a device or an outsized file
    among it."""
    try:
        return read_file(path, "the pack's file", MAX_PACK_FILE, error=EvidenceError,
                         over="give the folder 'appliance compliance report' wrote")
    except OSError as exc:
        raise EvidenceError(f"cannot read {path}: {exc.strerror}",
                            hint="give the folder 'appliance compliance report' wrote") from exc


def summary(checked: Checked) -> dict[str, Any]:
    return {"ok": True, "files": checked.files, "public_key": checked.public_key,
            "public_key_sha256": anchor.fingerprint(checked.public_key), "trusted_by": checked.trusted,
            "store_id": checked.store_id, "generated_at": checked.generated_at}
