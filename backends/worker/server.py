"""The worker's HTTP app: OpenAI's embeddings, completions and chat completions routes.

The server is up at once; models load in a background task (see `loading`) while `/health`
answers 503 with the phase, and model routes 503 with `Retry-After`. `/health` turns 200
only once every model is loaded and has answered a probe. `/startup` reports how long each
start-up phase took. All model work, loading included, runs in one compute thread owned by
the lifespan. torch is imported only by the loading, so the socket opens before it is.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import asynccontextmanager
from types import FrameType
from typing import TYPE_CHECKING, TypedDict, cast

import anyio
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from backends.worker.access import AccessLog
from backends.worker.answers import ChatShape, Json, TextShape, embedding_answer, model_card
from backends.worker.completions import CompletionJob, Prompt, complete, stream
from backends.worker.config import GenerationLimits, WorkerConfig, parse_args
from backends.worker.errors import (
    BodyTooLarge,
    InvalidRequest,
    ModelNotFound,
    ModelsLoading,
    WorkerError,
    error_payload,
)
from backends.worker.loading import LoadCancelled, ModelLoader, ModelSlot
from backends.worker.sampling import SamplingParams
from backends.worker.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    PromptValue,
    SamplingRequest,
    parse_body,
)
from backends.worker.startup import StartupReport, spawn_time

if TYPE_CHECKING:
    from backends.worker.generator import ChatModel

logger = logging.getLogger(__name__)

# Far above any prompt that fits a context window; larger bodies are answered 413.
MAX_BODY_BYTES = 8 * 1024 * 1024


class WorkerState(TypedDict):
    models: ModelSlot
    report: StartupReport
    compute: Executor
    limits: GenerationLimits
    started: int


def create_app(
    config: WorkerConfig,
    report: StartupReport | None = None,
    on_load_failure: Callable[[], None] | None = None,
) -> Starlette:
    """`on_load_failure` is called (on the event loop) when a model cannot be loaded."""
    report = report or StartupReport(*spawn_time({}))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[WorkerState]:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker-compute") as compute:
            models = ModelSlot(report)
            stopping = threading.Event()
            loader = ModelLoader(config, report, stopping)
            async with anyio.create_task_group() as group:
                report.begin("importing")
                group.start_soon(_load_models, loader, models, report, compute, on_load_failure)
                yield {
                    "models": models,
                    "report": report,
                    "compute": compute,
                    "limits": config.limits,
                    "started": int(time.time()),
                }
                # Stop a load in progress at its next step rather than finish it for nothing.
                stopping.set()
                group.cancel_scope.cancel()

    routes = [
        Route("/health", health),
        Route("/startup", startup),
        Route("/v1/models", list_models),
        Route("/v1/models/{model:path}", get_model),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]
    handlers = {
        WorkerError: on_worker_error,
        HTTPException: on_http_error,
        Exception: on_unexpected_error,
    }
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers=handlers,
        middleware=[Middleware(AccessLog)],
    )


async def _load_models(
    loader: ModelLoader,
    models: ModelSlot,
    report: StartupReport,
    compute: Executor,
    on_failure: Callable[[], None] | None,
) -> None:
    loop = asyncio.get_running_loop()
    try:
        registry = await loop.run_in_executor(compute, loader.run)
    except LoadCancelled:
        return
    except Exception as exc:
        logger.exception("loading the models failed")
        report.fail(f"{type(exc).__name__}: {exc}")
        if on_failure is not None:
            on_failure()
        return
    # Both on the event loop, with no await between: no request sees one without the other.
    models.fill(registry)
    report.begin("ready")
    logger.info("serving %s; start-up: %s", ", ".join(registry.names()), report.as_json()["phases"])


async def health(request: Request[WorkerState]) -> Response:
    if request.state["models"].ready:
        return json_response({"status": "ok"})
    report = request.state["report"]
    status = "failed" if report.failed else "loading"
    headers = {"Retry-After": str(ModelsLoading.retry_after_s)}
    return json_response({"status": status, "phase": report.phase}, 503, headers)


async def startup(request: Request[WorkerState]) -> Response:
    return json_response(request.state["report"].as_json())


async def list_models(request: Request[WorkerState]) -> Response:
    started = request.state["started"]
    cards = [model_card(name, started) for name in request.state["models"].get().names()]
    return json_response({"object": "list", "data": cards})


async def get_model(request: Request[WorkerState]) -> Response:
    name = request.path_params["model"]
    if name not in request.state["models"].get().names():
        raise ModelNotFound(name)
    return json_response(model_card(name, request.state["started"]))


async def embeddings(request: Request[WorkerState]) -> Response:
    body = parse_body(await read_body(request), EmbeddingRequest)
    embedder = request.state["models"].get().embedder(body.model)
    if body.dimensions is not None and body.dimensions != embedder.dimension:
        raise InvalidRequest(f"model '{body.model}' has {embedder.dimension} dimensions")
    texts = _embedding_texts(body.input)
    loop = asyncio.get_running_loop()
    result = await loop.run_in_executor(request.state["compute"], embedder.embed, texts)
    return json_response(embedding_answer(body.model, result, body.encoding_format or "float"))


async def completions(request: Request[WorkerState]) -> Response:
    body = parse_body(await read_body(request), CompletionRequest)
    model = request.state["models"].get().chat_model(body.model)
    prompts = _completion_prompts(model, body.prompt)
    return await _answer(request, model, body, body.max_tokens, TextShape(), prompts)


async def chat_completions(request: Request[WorkerState]) -> Response:
    body = parse_body(await read_body(request), ChatCompletionRequest)
    model = request.state["models"].get().chat_model(body.model)
    messages = [{"role": message.role, "content": message.text()} for message in body.messages]
    ids = model.chat_prompt(messages)
    return await _answer(request, model, body, body.token_limit, ChatShape(), [ids])


async def _answer(
    request: Request[WorkerState],
    model: ChatModel,
    body: SamplingRequest,
    max_tokens: int | None,
    shape: ChatShape | TextShape,
    prompts: list[list[int]],
) -> Response:
    # Every prompt is checked against the context before the first token: a stream's status
    # line goes out with its first event, and a 400 can no longer follow it.
    limits = request.state["limits"]
    checked = [
        Prompt(ids, _sampling(body, model.token_budget(len(ids), max_tokens, limits)))
        for ids in prompts
    ]
    job = CompletionJob(model, checked, body.n or 1, shape, request.state["compute"])
    if body.stream:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        events = stream(job, body.include_usage)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    return json_response(await complete(job))


def _sampling(body: SamplingRequest, max_tokens: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        stop=body.stop_strings,
    )


async def read_body(request: Request[WorkerState]) -> bytes:
    # Starlette's own limit answers in plain text; this one answers in OpenAI's shape.
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise BodyTooLarge(MAX_BODY_BYTES)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BodyTooLarge(MAX_BODY_BYTES)
        chunks.append(chunk)
    return b"".join(chunks)


def _embedding_texts(value: str | list[str] | list[int] | list[list[int]]) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise InvalidRequest("'input' must not be empty", "input")
    if not all(isinstance(text, str) for text in texts):
        raise InvalidRequest("token ids as input are not supported; send text", "input")
    return [str(text) for text in texts]


def _completion_prompts(model: ChatModel, value: PromptValue) -> list[list[int]]:
    """The token ids of each prompt: the schema has let through OpenAI's four forms only."""
    if isinstance(value, str):
        return [model.text_prompt(value)]
    if not value:
        raise InvalidRequest("'prompt' must not be empty.", "prompt")
    if all(isinstance(token, int) for token in value):
        return [model.check_token_ids(cast(list[int], value))]
    return [
        model.text_prompt(prompt) if isinstance(prompt, str) else model.check_token_ids(prompt)
        for prompt in cast(list[str] | list[list[int]], value)
    ]


async def on_worker_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, WorkerError)
    return json_response(exc.payload(), exc.status_code, exc.headers())


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return json_response(error_payload(exc.detail, error_type), exc.status_code, exc.headers)


async def on_unexpected_error(request: Request, exc: Exception) -> Response:
    # Starlette logs the traceback; the client gets OpenAI's shape, not a bare 500 page.
    return json_response(error_payload("internal error in the worker", "server_error"), 500)


def json_response(
    content: Json, status_code: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(orjson.dumps(content), status_code, headers, "application/json")


def _exit_after_drain(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> None:
    report = StartupReport(*spawn_time(os.environ))
    config = parse_args(argv)
    # Every model is a local folder; never let a library reach for the Hugging Face hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import uvicorn

    logging.basicConfig(level=config.log_level.upper(), format="%(levelname)s %(name)s %(message)s")
    # uvicorn drains on SIGTERM and then raises the signal again; a drained worker has done
    # what was asked of it, so that second delivery ends the process with status 0.
    signal.signal(signal.SIGTERM, _exit_after_drain)

    def stop_serving() -> None:
        server.should_exit = True  # bound below, before the app can call this

    app = create_app(config, report, stop_serving)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=config.log_level,
            access_log=False,  # see `access`: requests at debug, probes never
            timeout_graceful_shutdown=5,
        )
    )
    server.run()
    if report.failed:
        raise SystemExit(1)
