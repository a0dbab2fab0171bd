"""The report as one self-contained HTML page: the same facts as report.json, for people.

No script, no font, no image, no link to anything outside the page: the box is often
offline and an auditor may open the file anywhere. Every value is escaped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #111; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #999; }
table { border-collapse: collapse; width: 100%; margin: .5em 0 1em; }
th, td { border: 1px solid #bbb; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #eee; } td.detail { font: 12px monospace; white-space: pre-wrap; word-break: break-all; }
.bad { color: #a00; font-weight: bold; } .ok { color: #060; font-weight: bold; } p.none { color: #555; }
@media print { body { margin: 0; max-width: none; } h2 { break-after: avoid; } }
"""


def html(facts: dict[str, Any]) -> str:
    """The whole page for the facts collect() returned."""
    store, audit = facts["store"], facts["audit"]
    verification = audit["verification"]
    head = audit["signed_head"] or {}
    parts = [
        f"<h1>Compliance evidence: appliance store {_e(store['id'])}</h1>",
        _pairs([("Generated", facts["generated_at"]), ("Appliance version", facts["appliance_version"]),
                ("Store", store["path"]), ("Store created", store["created_at"]),
                ("Schema version", store["schema_version"]), ("Signing key (Ed25519)", audit["public_key"]),
                ("Its SHA-256", audit["public_key_sha256"])]),
        ("<p>The files of this pack are listed with their SHA-256 in manifest.json, signed in manifest.sig with the "
        "key above, the same key that signs the audit log's head. <code>appliance compliance verify DIR</code> "
        "checks them offline. A pack proves who wrote it only if that key is trusted: compare its SHA-256 with an "
        "audit checkpoint kept elsewhere (<code>--checkpoint</code>) or a key given separately "
        "(<code>--public-key</code>).</p>"),
        "<h2>1. Audit chain</h2>",
        _pairs([("Result", _verdict(verification["ok"], verification["problem"])),
                ("Records", verification["records"]), ("First bad record", verification["first_bad"]),
                ("Signed head: record", head.get("seq")), ("Signed head: hash", head.get("hash")),
                ("Signed head: signature", head.get("signature"))], raw={"Result"}),
        "<h2>2. Data inventory</h2>",
        _table(["Dataset", "Id", "Task", "Examples", "Bytes", "Residency", "Created", "Content removed", "Runs",
                "Models", "Bursts"],
               ([d["ref"], d["id"][:16], d["task"], d["examples"], d["bytes"], d["residency"], d["created_at"],
                 d["removal"] or "", len(d["used_by"]["runs"]), ", ".join(d["used_by"]["models"]),
                 ", ".join(d["used_by"]["bursts"])] for d in facts["datasets"]), "no datasets"),
        _table(["Served texts (or images) of model", "Kept (sealed)", "With a true label", "Oldest", "Kept for days"],
               ([s["model"], s["kept"], s["labelled"], s["oldest"], s["keep_days"]] for s in facts["served_texts"]),
               "no served texts or images kept"),
        "<h2>3. Model lineage</h2>",
        _table(["Run", "Dataset", "Trained on", "Status", "Params", "Model versions (variants; aliases)"],
               ([r["id"], r["dataset"], r["trained_on"], r["status"], _json(r["params"]),
                 "; ".join(f"{m['ref']} ({', '.join(v['name'] for v in m['variants'])}"
                           f"{'; ' + ', '.join(m['aliases']) if m['aliases'] else ''})" for m in r["model_versions"])]
                for r in facts["lineage"]["runs"]), "no training runs", detail={4}),
        _table(["Moved at", "Model", "Alias", "Version", "Kind"],
               ([m["moved_at"], m["model"], m["alias"], m["version"], m["kind"]]
                for m in facts["lineage"]["alias_moves"]), "no deployments or alias moves"),
        "<h2>4. Data transfers off the box</h2>",
        _table(["When", "Who", "To", "Dataset", "Dataset bytes", "Base model", "Sealed bytes", "Submission",
                "Last step"],
               ([t["at"], t["actor"], t["to"], t["dataset"], t["dataset_bytes"], t["base_model"], t["sealed_bytes"],
                 t["submission"], t["last_step"]] for t in facts["transfers"]), "no data has left this box"),
        "<h3>Transfers refused by residency</h3>",
        _records(facts["refused_transfers"], "none refused"),
        "<h2>5. Key management</h2>",
        _pairs([("Master key source", facts["keys"]["in_force"]["source"]),
                ("Master key fingerprint", facts["keys"]["in_force"]["fingerprint"])]),
        _records(facts["keys"]["history"], "no key events on record"),
        "<h2>6. Access control</h2>",
        _table(["User", "Id", "Role", "Created", "Last use", "Revoked"],
               ([u["name"], u["id"], u["role"], u["created_at"], u["last_used_at"], u["revoked_at"]]
                for u in facts["access"]["users"]), "no control-API users"),
        _table(["API key", "Id", "Models", "Created", "Last use", "Revoked"],
               ([k["name"], k["id"], ", ".join(k["models"]), k["created_at"], k["last_used_at"], k["revoked_at"]]
                for k in facts["access"]["api_keys"]), "no API keys"),
        f"<p>Refused control-API requests on record: {_e(facts['access']['refused_requests'])}.</p>",
        "<h2>7. Erasures (data subject requests)</h2>",
        _records(facts["erasures"], "no erasures on record"),
        "<h2>8. Encryption in force</h2>",
        _pairs([(f"{section}: {name}", value) for section in ("blobs", "master_key", "audit", "database")
                for name, value in facts["encryption"][section].items()]),
        _table(["File", "Mode", "At most", "OK"],
               ([f["path"], f["mode"], f["expected"], "yes" if f["ok"] else "NO"]
                for f in facts["encryption"]["files"]), "no files"),
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Compliance evidence {_e(store['id'])}</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(parts) + "\n</body></html>\n")


def _e(value: Any) -> str:
    if value is None:
        return ""
    return escape(value if isinstance(value, str) else _json(value) if isinstance(value, dict | list) else str(value))


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _verdict(ok: bool, problem: str | None) -> str:
    return '<span class="ok">intact</span>' if ok else f'<span class="bad">TAMPERED: {_e(problem)}</span>'


def _pairs(pairs: Sequence[tuple[str, Any]], raw: set[str] = frozenset()) -> str:
    rows = "".join(f"<tr><th>{_e(name)}</th><td>{value if name in raw else _e(value)}</td></tr>"
                   for name, value in pairs)
    return f"<table>{rows}</table>"


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], empty: str, detail: set[int] = frozenset()) -> str:
    opening = ['<td class="detail">' if i in detail else "<td>" for i in range(len(headers))]
    body = "".join("<tr>" + "".join(f"{opening[i]}{_e(cell)}</td>" for i, cell in enumerate(row)) + "</tr>"
                   for row in rows)
    if not body:
        return f'<p class="none">{_e(empty)}</p>'
    return "<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in headers) + f"</tr>{body}</table>"


def _records(records: list[dict[str, Any]], empty: str) -> str:
    return _table(["Seq", "When", "Who", "Action", "Object", "Outcome", "Details"],
                  ([r["seq"], r["at"], r["actor"], r["action"], r["object"], r["outcome"], _json(r["details"])]
                   for r in records), empty, detail={6})
