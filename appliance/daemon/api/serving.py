"""What serves and how well: traffic and drift per version, a prediction to try, true labels, live accuracy.

The routes that ask the inference runtime are async: it lives on the daemon's event loop and never touches the
store.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from appliance.core.errors import BadRequest
from appliance.daemon.api.deps import Operator, Serving, Settings, Shared, SharedStore, Viewer, actor
from appliance.registry import feedback
from appliance.serve import app as inference
from appliance.serve import oip
from appliance.serve.rates import KeyRates
from appliance.serve.web import Body

router = APIRouter()
_NO_TRAFFIC = {"requests": 0, "requests_per_s": None, "error_rate": None, "p50_ms": None, "p99_ms": None}


class PredictRequest(Body):
    """Texts for a text model, or images (files, base64-encoded) for an image model: one of the two."""

    texts: list[str] | None = Field(None, min_length=1, description="texts to classify with the model as it serves")
    images: list[str] | None = Field(None, min_length=1, description="image files, base64-encoded, for an image "
                                                                     "model")


class FeedbackRequest(inference.FeedbackRequest):
    source: str = Field("api", max_length=200, description="where the labels come from, e.g. the file's name")


@router.get("/v1/serving")
async def serving(request: Request, _user: Viewer, runtime: Serving, shared: Shared,
                  settings: Settings) -> dict[str, Any]:
    """What serves, with requests/s, error rate and latency over the last minute, and drift per version."""
    served_now = runtime.describe()
    seconds, stats = request.app.state.traffic.summary()
    live = {(entry["model"], entry["version"]): entry["windows"]["24h"]
            for entry in await asyncio.to_thread(_quality, shared)}
    models = []
    for served in served_now:
        name = served["model"]
        for version in served["versions"]:
            version.update(stats.get((name, str(version["version"])), _NO_TRAFFIC))
            version["feedback"] = live.get((name, version["version"]))
        models.append({**served, **stats.get((name, "all"), _NO_TRAFFIC), "endpoints": {
            "predict": f"{settings.inference_url}/v1/models/{name}:predict",
            "infer": f"{settings.inference_url}/v2/models/{name}/infer"}})
    grpc = f"{settings.serve.host}:{settings.serve.grpc_port}" if settings.serve.grpc_port else None
    return {"inference_url": settings.inference_url, "grpc_address": grpc, "ready": runtime.ready, "window_s": seconds,
            "models": models}


@router.post("/v1/models/{model}/predict")
async def try_prediction(request: Request, model: str, body: PredictRequest, user: Viewer,
                         runtime: Serving) -> dict[str, Any]:
    """Classify texts (or images) with the model as it serves, for trying it out: counted like any request, within
    the rate of an API key, but not kept for feedback (an API key's predictions are)."""
    if (body.texts is None) == (body.images is None):
        raise BadRequest("give texts or images, one of the two", hint="texts for a text model, images (base64) for "
                         "an image model")
    rates: KeyRates = request.app.state.user_rates
    rates.admit(user)
    examples = body.texts or [oip.unbased(image, index) for index, image in enumerate(body.images or ())]
    rates.charge(user, len(examples))
    answer = await runtime.predict(model, examples, actor(user), keep=False)
    return {"model": model, "version": answer.loaded.version, "variant": answer.loaded.variant,
            "predictions": inference.label_scores(answer)}


@router.post("/v1/feedback")
async def post_feedback(body: FeedbackRequest, user: Operator, runtime: Serving) -> dict[str, Any]:
    """True labels for predictions of any model (what `appliance feedback import` sends)."""
    return await runtime.record_feedback([(item.prediction_id, item.label) for item in body.feedback], actor(user),
                                         source=body.source)


@router.get("/v1/quality")
def quality(_user: Viewer, shared: Shared, model: str | None = None) -> list[dict[str, Any]]:
    """Live accuracy on feedback by model version over the last hour, day and week, and the labels not yet
    trained on."""
    with shared.use() as store:
        return feedback.report(store, model)


def _quality(shared: SharedStore) -> list[dict[str, Any]]:
    with shared.use() as store:
        return feedback.quality(store)
