"""Compliance evidence: what the store holds and has done, as a signed pack an auditor can check offline.

    evidence.collect(store) -> dict    the facts, read from the store and its audit log
    render.html(facts) -> str          the same facts as one self-contained HTML page
    pack.write / pack.verify           the files, their signed manifest, and the check of both
"""
