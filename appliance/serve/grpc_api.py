"""The inference API over gRPC: the Open Inference Protocol's GRPCInferenceService, on its own port.

Off until `serve.grpc_port` names a port; then the REST app's lifespan runs it beside REST, on the same event loop,
over the same runtime: the same API keys (metadata `authorization: Bearer apl_...` or `x-api-key`), scopes, rates,
batcher, canary routing, metrics and usage, and TLS when serving has it. What a request may ask and what an answer
holds is `oip`'s, as for REST; inputs travel as `bytes_contents` (texts, images), `fp32_contents` (an image's
prepared pixels) or raw contents (tritonclient's way),
answers always as raw contents. A refusal is the gRPC status nearest to the REST one (`CODES`), with the same
message and hint; the body size limit is gRPC's message limit. As REST bounds a request's body, a call shows its
key before its message is read and sends the message within serve.body_timeout_s (`_answered`): the calls are
unary, but grpc is given them as taking a stream, since it reads a unary call's whole message, however slowly it
comes, before the call's handler runs.

The messages come from `proto/inference.proto`, compiled into `proto/inference.desc` and loaded into a pool of
their own, so a process that also holds a client's copy of the protocol (Triton's) meets no clash. After changing
the .proto, in appliance/serve/proto: `python -m grpc_tools.protoc -I. --descriptor_set_out=inference.desc
inference.proto` (tests/serve/test_grpc.py checks that the two agree).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from importlib import metadata
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from appliance import pixels
from appliance.access import auth
from appliance.core.config import Settings
from appliance.core.errors import ApplianceError, BadRequest, PayloadTooLarge, RequestTimeout
from appliance.core.text import whole_number
from appliance.serve import access, oip, tls
from appliance.serve import metrics as serve_metrics
from appliance.serve.rates import KeyRates
from appliance.serve.runtime import Runtime
from appliance.serve.web import status_of

log = logging.getLogger(__name__)
DESCRIPTOR = Path(__file__).with_name("proto") / "inference.desc"
SERVICE = "inference.GRPCInferenceService"
CROWD_MEMORY_S = 0.1  # after calls overlapped, this long before a lone call may be inferred on the event loop
# A connection's streams, bounded as HTTP/2 counts them, which its client honours by queueing. grpcio's default
# "overload protection" also counts finished calls until their memory is freed, which no client can see: a busy
# client was refused streams (UNAVAILABLE, RST_STREAM 7) well below the limit.
STREAMS = [("grpc.max_concurrent_streams", 100), ("grpc.http.overload_protection", 0)]
OPEN_CALLS = {"ServerLive", "ServerReady"}  # the health calls: no key
CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
         403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
         408: grpc.StatusCode.DEADLINE_EXCEEDED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
         429: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE}


def _messages() -> dict[str, type[Message]]:
    pool = descriptor_pool.DescriptorPool()
    (proto,) = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR.read_bytes()).file
    pool.Add(proto)
    return {kind.name: message_factory.GetMessageClass(kind)
            for kind in pool.FindFileByName(proto.name).message_types_by_name.values()}


M = _messages()


class Service:
    """The six calls; each gets its request message and the caller's API key (None for the health calls, which
    need none), and answers a message."""

    def __init__(self, runtime: Runtime, rates: KeyRates) -> None:
        self.runtime, self.rates = runtime, rates
        self.keeps_ids = runtime.predictions is not None
        self.inferring = 0  # ModelInfer calls past their key check and not yet answered
        self.crowded_until = 0.0  # time.monotonic() until which calls are expected to have company

    async def server_live(self, _request: Message, _key: auth.ApiKey | None) -> Message:
        return M["ServerLiveResponse"](live=True)

    async def server_ready(self, _request: Message, _key: auth.ApiKey | None) -> Message:
        return M["ServerReadyResponse"](ready=self.runtime.ready)

    async def server_metadata(self, _request: Message, _key: auth.ApiKey) -> Message:
        return M["ServerMetadataResponse"](name="appliance", version=metadata.version("appliance"),
                                           extensions=oip.EXTENSIONS)

    async def model_ready(self, request: Message, key: auth.ApiKey) -> Message:
        key.permit(request.name)
        if not self.runtime.expects(request.name):
            raise self.runtime.not_found(request.name, key.may_call)
        return M["ModelReadyResponse"](ready=self.runtime.model_ready(request.name, _version(request.version)))

    async def model_metadata(self, request: Message, key: auth.ApiKey) -> Message:
        key.permit(request.name)
        version = _version(request.version)
        self.runtime.require(request.name, version, key.may_call)
        shown = oip.model_metadata(request.name, self.runtime.route(request.name, key.may_call), self.keeps_ids,
                                   version)
        tensors = M["ModelMetadataResponse"].TensorMetadata
        return M["ModelMetadataResponse"](
            name=shown["name"], versions=shown["versions"], platform=shown["platform"],
            inputs=[tensors(**tensor) for tensor in shown["inputs"]],
            outputs=[tensors(**tensor) for tensor in shown["outputs"]])

    async def model_infer(self, request: Message, key: auth.ApiKey) -> Message:
        key.permit(request.model_name)
        self.rates.admit(key)
        version = _version(request.model_version)
        pictures = self.runtime.require(request.model_name, version, key.may_call)
        limit = self.runtime.settings.serve.max_body_bytes
        if pictures is None and request.ByteSize() > limit:  # gRPC's own limit is the image models' larger one
            raise PayloadTooLarge(f"the request is over the {limit}-byte limit", hint="send fewer or shorter texts "
                                  "per request")
        ask = _ask(request, self.keeps_ids, pictures)
        self.rates.charge(key, len(ask.examples))
        # A call alone, when none had company lately, may be inferred on the event loop as a lone HTTP request is.
        # Calls in company go to the batcher: they reach it over several turns of the loop, which inferring on it
        # would hold up, so that they would be inferred one by one.
        self.inferring += 1
        now = time.monotonic()
        if self.inferring > 1:
            self.crowded_until = now + CROWD_MEMORY_S
        try:
            answer = await self.runtime.predict(request.model_name, ask.examples, f"key:{key.name}", key.may_call,
                                                version, inline=self.inferring == 1 and now >= self.crowded_until)
        finally:
            self.inferring -= 1
        tensors = oip.tensors(answer, [name for name, _ in ask.outputs])
        output = M["ModelInferResponse"].InferOutputTensor
        return M["ModelInferResponse"](
            model_name=request.model_name, model_version=str(answer.loaded.version), id=request.id,
            outputs=[output(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape) for tensor in tensors],
            raw_output_contents=[tensor.encode() for tensor in tensors])


def _token(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The API key a call's metadata carries: `x-api-key`, or `authorization: Bearer ...`."""
    sent = {name: value for name, value in metadata or () if isinstance(value, str)}
    bearer = sent.get("authorization", "")
    return sent.get("x-api-key") or (bearer[7:] if bearer[:7].lower() == "bearer " else None)


def _version(given: str) -> int | None:
    """A request's version: empty for the route's choice, else a number."""
    if not given:
        return None
    if (number := whole_number(given)) is None:
        raise BadRequest(f"version {given[:20]!r} is not a number", hint="give a version number, or none")
    return number


def _ask(request: Message, keeps_ids: bool, pictures: pixels.Pictures | None) -> oip.Ask:
    """What a ModelInferRequest asks: its examples from raw contents or the input's contents, the outputs it
    names."""
    if len(request.inputs) != 1:
        names = [tensor.name for tensor in request.inputs]
        raise BadRequest(f"the request has {len(names)} inputs ({', '.join(map(repr, names))})",
                         hint=f"the model takes one input, of: {', '.join(map(repr, oip.inputs_of(pictures)))}")
    tensor = request.inputs[0]
    if request.raw_input_contents:
        if len(request.raw_input_contents) != 1 or tensor.HasField("contents"):
            raise BadRequest("give the input's data once: as one raw content, or as its contents",
                             hint="raw_input_contents holds one entry per input")
        data = request.raw_input_contents[0]
    else:
        data = list(tensor.contents.fp32_contents if tensor.datatype == "FP32" else tensor.contents.bytes_contents)
    examples = oip.examples_of(tensor.name, tensor.datatype, list(tensor.shape), data, pictures)
    return oip.Ask(examples, oip.wanted([(output.name, True) for output in request.outputs], keeps_ids), request.id)


Call = Callable[[Message, auth.ApiKey | None], Awaitable[Message]]  # a Service call
Handler = Callable[[AsyncIterator[Message], grpc.aio.ServicerContext], Awaitable[Message]]  # a call as grpc runs it


def _answered(name: str, call: Call, runtime: Runtime) -> Handler:
    """The call as grpc runs it. The caller's key is checked from the call's metadata (the health calls need none),
    then its message is read, within serve.body_timeout_s, and the call answers it. An ApplianceError becomes the
    gRPC status nearest its HTTP one, counted in the metrics as REST counts its refusals; a failure it did not
    expect is logged and answered INTERNAL, its words never shown."""
    timeout_s = runtime.settings.serve.body_timeout_s

    async def answer(_requests: AsyncIterator[Message], context: grpc.aio.ServicerContext) -> Message:
        request = None
        try:
            key = None if name in OPEN_CALLS else runtime.authorize(_token(context.invocation_metadata()), None)
            request = await _message(context, timeout_s)
            return await call(request, key)
        except ApplianceError as exc:
            status = status_of(type(exc))
            if not getattr(exc, "counted", False):
                model = getattr(request, "model_name", None) or getattr(request, "name", None)
                runtime.metrics.request(model if model in runtime.routes else serve_metrics.OTHER, None, status)
            await context.abort(CODES.get(status, grpc.StatusCode.INVALID_ARGUMENT),
                                f"{exc.message}{f' ({exc.hint})' if exc.hint else ''}")
            raise  # not reached: abort raises
        except grpc.aio.AbortError:
            raise
        except Exception:  # gRPC would send the exception's own words
            log.exception("a gRPC %s call failed", name)
            await context.abort(grpc.StatusCode.INTERNAL, "the server failed on this request (its log says why)")
            raise

    return answer


async def _message(context: grpc.aio.ServicerContext, timeout_s: float) -> Message:
    """A call's one message, read whole within timeout_s (RequestTimeout if not)."""
    try:
        message = await asyncio.wait_for(context.read(), timeout_s)
    except TimeoutError:
        raise RequestTimeout("the request message did not arrive in time",
                             hint="send the whole message without pausing") from None
    if message is grpc.aio.EOF:
        raise BadRequest("the call sent no request message", hint="send one request message")
    return message


def _logged(name: str, handler: Handler) -> Handler:
    """The call with its access log line, which names the status code the call ended with."""

    async def answer(requests: AsyncIterator[Message], context: grpc.aio.ServicerContext) -> Message:
        with access.request("grpc", name) as entry:
            try:
                return await handler(requests, context)
            finally:
                entry.status = _code_name(context.code())

    return answer


# The context gives the status a call ended with as a StatusCode, as its number, or as None for OK.
_CODE_NAMES: dict[object, str] = {key: code.name for code in grpc.StatusCode for key in (code, code.value[0])}


def _code_name(code: object) -> str:
    """The name of the status a call ended with."""
    return _CODE_NAMES.get(code, "OK")


def handlers(service: Service, runtime: Runtime) -> grpc.GenericRpcHandler:
    """The six calls, each answered (`_answered`) and, when serve.access_log, logged; grpc is told each takes a
    stream, so that it leaves reading the message to `_answered`."""
    calls = {"ServerLive": service.server_live, "ServerReady": service.server_ready,
             "ServerMetadata": service.server_metadata, "ModelReady": service.model_ready,
             "ModelMetadata": service.model_metadata, "ModelInfer": service.model_infer}

    def handler(name: str, call: Call) -> Handler:
        answered = _answered(name, call, runtime)
        return _logged(name, answered) if runtime.settings.serve.access_log else answered

    return grpc.method_handlers_generic_handler(SERVICE, {
        name: grpc.stream_unary_rpc_method_handler(
            handler(name, call), request_deserializer=M[f"{name}Request"].FromString,
            response_serializer=M[f"{name}Response"].SerializeToString)
        for name, call in calls.items()})


async def start(settings: Settings, runtime: Runtime, rates: KeyRates) -> grpc.aio.Server:
    """The gRPC server on serve.host:serve.grpc_port, started; TLS with serving's certificate when serve.tls."""
    serve = settings.serve
    # As for REST: a body within the limits (gRPC has one for all models: the larger), a connection's handshake within
    # serve.header_timeout_s, a call's message within serve.body_timeout_s (`_answered`), an idle connection closed (a
    # client reconnects when it has more to ask), a connection's streams (STREAMS) and the calls in progress bounded.
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", max(serve.max_body_bytes, serve.max_image_body_bytes)), *STREAMS,
                 ("grpc.server_handshake_timeout_ms", int(serve.header_timeout_s * 1000)),
                 ("grpc.max_connection_idle_ms", 60_000)],
        maximum_concurrent_rpcs=serve.max_connections)
    server.add_generic_rpc_handlers((handlers(Service(runtime, rates), runtime),))
    address = f"{serve.host}:{serve.grpc_port}"
    if serve.tls:
        files = tls.uvicorn_options(settings)
        pair = (Path(files["ssl_keyfile"]).read_bytes(), Path(files["ssl_certfile"]).read_bytes())
        server.add_secure_port(address, grpc.ssl_server_credentials([pair]))
    else:
        server.add_insecure_port(address)
    await server.start()
    return server
