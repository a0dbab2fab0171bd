"""A server whose audit log is cut under it stops answering at once, and resumes only once the rewind is accepted."""

from __future__ import annotations

import dataclasses
import shutil
import sqlite3
from pathlib import Path

from tests.serve.conftest import State, start_server, stop_server


def test_a_rewound_store_is_not_served_until_the_rewind_is_accepted(state: State, tmp_path: Path) -> None:
    shutil.copytree(state.settings.state_dir, tmp_path / "var")
    copy = State(dataclasses.replace(state.settings, state_dir=tmp_path / "var", key_file=tmp_path / "var" / "master.key"),
                 state.token, state.scoped_token, state.unlabelling_token)
    server = start_server(copy)
    try:
        with server.client() as http:
            assert http.post("/v1/models/tickets:predict", json={"instances": ["refund please"]}).status_code == 200
            conn = sqlite3.connect(copy.settings.db_path)
            conn.execute("DROP TRIGGER IF EXISTS audit_no_delete")
            conn.execute("DELETE FROM audit WHERE seq > (SELECT MAX(seq) - 2 FROM audit)")
            conn.commit()
            conn.close()

            def refused() -> bool:
                answer = http.post("/v1/models/tickets:predict", json={"instances": ["refund please"]})
                return answer.status_code == 503 and "serving stopped: the audit log was rewound" in answer.text

            server.wait(refused, 10)
            assert http.get("/v2/health/ready").status_code == 400  # not ready: a 4xx, as the protocol says
            assert "accept-rewind" in http.post("/v1/models/tickets:predict", json={"instances": ["x"]}).json()["hint"]

            copy.cli("audit", "accept-rewind", "--reason", "test", "--yes")
            server.wait(lambda: http.post("/v1/models/tickets:predict", json={"instances": ["refund please"]})
                        .status_code == 200, 10)
    finally:
        log = stop_server(server)
    assert "serving stops: the audit log was rewound" in log and "serving resumes" in log
