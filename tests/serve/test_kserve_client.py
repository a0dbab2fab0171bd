"""The KServe Python SDK's REST client against the real server, as its documentation shows.

It runs in a child process: the SDK and Triton's gRPC client (tests/serve/test_grpc.py) each register the protocol's
messages under the same names in protobuf's default pool, so no one process can import both; the server, which keeps
its own pool, meets neither.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.serve.conftest import Server

CLIENT = r'''
import asyncio, json, sys

import httpx
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

async def main(url, key):
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0))
    signed = {"Authorization": f"Bearer {key}"}
    texts = ["refund for the invoice charge please", "où est mon colis ?"]
    request = InferRequest(model_name="tickets", request_id="k-1",
                           infer_inputs=[InferInput(name="text", shape=[2], datatype="BYTES", data=texts)])
    answer = await client.infer(url, request, model_name="tickets", headers=signed)
    try:
        await client.infer(url, request, model_name="tickets")
        refused = None
    except httpx.HTTPStatusError as error:
        refused = error.response.status_code
    print(json.dumps({
        "live": await client.is_server_live(url), "ready": await client.is_server_ready(url),
        "model_ready": await client.is_model_ready(url, "tickets", headers=signed),
        "id": answer.id, "model": answer.model_name,  # the SDK keeps no model_version from a REST answer
        "outputs": {output.name: output.as_numpy().tolist() for output in answer.outputs},
        "anonymous": refused}, default=lambda value: value.decode() if isinstance(value, bytes) else str(value)))
    await client.close()

asyncio.run(main(*sys.argv[1:]))
'''


def test_the_kserve_rest_client_reads_health_and_answers(server: Server) -> None:
    done = subprocess.run([sys.executable, "-c", CLIENT, server.url, server.state.token], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["live"] and seen["ready"] and seen["model_ready"]
    assert seen["id"] == "k-1" and seen["model"] == "tickets" and seen["anonymous"] == 401
    assert seen["outputs"]["label"][0] == "billing" and len(seen["outputs"]["probabilities"]) == 2
    assert seen["outputs"]["truncated"] == [False, False]
