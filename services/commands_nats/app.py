"""Commands over NATS request/reply, served with FastStream: a tenant sends a request to
``<commands>.<tenant>.<command>`` (events/commands.py) and the reply is the answer.

Each command runs the same code as its HTTP route (services/requests/writes.py): the same checks,
the same command handlers and decisions, the same answer body; an error replies with the same
problem (``code``, ``status``, ``detail``) through the same mapping (services/requests/problems.py),
with the HTTP status in the ``Chronicle-Status`` header. The tenant is the subject's token: NATS
lets a tenant's credentials request on its own command subjects only (events/credentials.py).

Core NATS, not JetStream: nothing is stored, so the ack policy is ``MANUAL`` (stated, as FastStream's
default for a stream would terminate a message whose handler raised) and a request that gets no
reply is simply retried by its client; idempotency is the command handlers' own (message ids, the
append's ``idempotency_key``). The subscribers form one queue group: any number of ``chronicle
commands`` processes share the requests.

The service answers as the operator, which may publish anywhere, so it answers only a reply subject
under the requesting tenant's own inbox (``_INBOX_T.<tenant>.``, events/credentials.py), or the
operator's own clients' default inbox (``_INBOX.``, where no tenant may listen): a request
naming any other reply subject (another tenant's event subject or inbox, anything) is dropped
before it does anything, with a warning, and nothing is published. So is a request with no reply
subject, before its limit or its body is looked at: that is how JetStream's publish acks arrive when
a tenant names another tenant's command subject as its publish's reply (the server publishes them,
past NATS permissions), and each was admitted against that other tenant's limit.
"""

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

from faststream import AckPolicy, ExceptionMiddleware, Path
from faststream.nats import NatsBroker, NatsMessage, NatsResponse, NatsRouter
from nats.aio.msg import Msg
from pydantic import ValidationError

from events import commands as cmd
from events.commands import STATUS_HEADER
from events.credentials import TENANT_INBOX_ROOT
from events.ids import InvalidId, check_tenant, decode_token
from events.subjects import SubjectLayout
from services import brokers, natsclient
from services.bootstrap import STALE_DETECTION, Container, nats_security
from services.errors import InvalidRequest, MalformedJson
from services.offload import off_loop, weigh_body
from services.requests import writes
from services.requests.limits import Charge, TenantLimits, limits_of
from services.requests.problems import Problem, internal_error, invalid_request, problem_of, validation_errors
from services.requests.strict_json import strict_loads
from services.settings import Settings

log = logging.getLogger("chronicle.commands")
QUEUE = "chronicle-commands"
"""The queue group of every command subscriber: each request goes to one process."""

ContainerOf = Callable[[], Container]
Handler = Callable[..., Awaitable[NatsResponse]]
Parser = Callable[[Msg], Awaitable[NatsMessage]]


class ForeignReply(Exception):
    """A request whose reply subject is not under its tenant's inbox, or that names none: dropped
    unanswered."""


OPERATOR_INBOX_ROOT = "_INBOX"
"""NATS clients' default inbox: the operator's own clients (tools, tests, the command benchmark)
send requests with it. No tenant may subscribe there (events/credentials.py) and no stream takes
it, so a reply there reaches only the client whose inbox it is."""


def answerable(tenant_token: str, reply_to: str) -> bool:
    """True if the operator may answer on ``reply_to`` a request from the tenant whose subject
    token is ``tenant_token``: one under that tenant's inbox, or one under the default inbox of the
    operator's own clients (no tenant can listen there). Never a request with no reply subject: a
    publish ack JetStream sends to the subject another tenant named as its reply has none, and
    the tenant whose subject it lands on did not send it."""
    return reply_to.startswith(f"{TENANT_INBOX_ROOT}.{tenant_token}.") or reply_to.startswith(f"{OPERATOR_INBOX_ROOT}.")


def reply(body: dict[str, Any], status: int = 200) -> NatsResponse:
    return NatsResponse(body, headers={STATUS_HEADER: str(status)})


async def _strict_json(msg: NatsMessage) -> Any:
    """The request's JSON, parsed as strictly as an HTTP body (services/requests/strict_json.py)."""
    try:
        return await off_loop(strict_loads, msg.body)
    except json.JSONDecodeError as exc:  # what strict_loads refuses itself is its own problem already
        raise MalformedJson(f"the request is not valid JSON: {exc.msg}") from exc


REQUEST_PARAMETER = "body"
"""The name of each handler's request parameter, under which FastStream validates the request:
its errors' ``loc`` start with it, where a command's start at the request's root."""


def from_request_root(error: dict[str, Any]) -> dict[str, Any]:
    """A validation error of a command's request with its ``loc`` from the request's root
    (``["message"]``, not FastStream's ``["body", "message"]``), as the errors found past the
    edge (a message's shape: ``["message", "role"]``) already are."""
    loc = error["loc"]
    return {**error, "loc": loc[1:]} if loc[:1] == [REQUEST_PARAMETER] else error


def command_problem(exc: BaseException) -> Problem | None:
    """:func:`problem_of` as a command's reply says it: a request FastStream could not validate as
    the command's model names its fields from the request's root; an error of the whole request
    (not an object) has an empty ``loc``, called ``request`` in the detail."""
    if isinstance(exc, ValidationError):
        return invalid_request([from_request_root(e) for e in validation_errors(exc)], root="request")
    return problem_of(exc)


def problems() -> ExceptionMiddleware:
    """Every error becomes a problem reply, as over HTTP: a mapped one with its code, anything
    else ``500 internal_error`` (logged)."""
    middleware = ExceptionMiddleware()

    @middleware.add_handler(ForeignReply)  # raised by the parser, before the handler: nothing is published
    async def _dropped(exc: ForeignReply) -> None:
        log.warning("command dropped: %s", exc)

    @middleware.add_handler(Exception, publish=True)
    async def _problem(exc: Exception) -> NatsResponse:
        body = command_problem(exc)
        if body is None:
            log.error("command failed", exc_info=exc)
            body = internal_error(exc)
        return reply(body, int(body["status"]))

    return middleware


def storable(subject: str, limit: int = 200) -> str:
    """``subject`` bounded and printable, for a log line."""
    return subject[:limit].encode("unicode_escape").decode("ascii")


def operation_name(command: cmd.Command) -> str:
    """The command's name in the AsyncAPI document (its channel and operation)."""
    return f"cmd.{command.name}"


def tenant_of(token: str) -> str:
    try:
        return check_tenant(decode_token(token))
    except (InvalidId, ValueError) as exc:
        raise InvalidRequest(f"the subject's tenant token is not valid: {exc}") from exc


def command_router(
    layout: SubjectLayout, container: ContainerOf, *, workers: int = 64, limits: TenantLimits | None = None
) -> NatsRouter:
    """The subscribers of every command in :data:`events.commands.COMMANDS` under ``layout``'s
    command prefix; ``container`` gives the composition root when a request arrives; ``limits``
    refuses a tenant's requests over its limit (``429 rate_limited``) before they do anything, and
    charges a batch or a fork the events it publishes past its first, as the API does."""
    prefix = f"{layout.commands}."
    router = NatsRouter(prefix=prefix)

    def charger(tenant: str, msg: NatsMessage) -> Charge | None:
        """The request's charge, its body (weighed as it was admitted: :func:`decoded`) counted."""
        return limits.charger(tenant, weighed=len(msg.body)) if limits is not None else None

    async def decoded(msg: NatsMessage) -> Any:
        """The request's JSON, once its tenant (the subject's token) is under its limit and its
        body weighed (services/requests/limits.py): a request over it is refused before its body is
        parsed, whatever the body."""
        if limits is not None:
            tenant = tenant_of(msg.raw_message.subject[len(prefix) :].partition(".")[0])
            limits.admit(tenant)
            charge = limits.charger(tenant)
            if charge is not None:
                charge.weigh(len(msg.body))
        weigh_body(len(msg.body))  # a large one is parsed and checked off the loop (services/offload.py)
        return await _strict_json(msg)

    async def parsed(msg: Msg, original: Parser) -> NatsMessage:
        """The request, if its reply subject is one the operator may answer (:func:`answerable`);
        else :class:`ForeignReply`, raised before the command or its limit is looked at."""
        token = msg.subject[len(prefix) :].partition(".")[0]
        if not msg.reply:
            raise ForeignReply(
                f"{storable(msg.subject)} names no reply subject (a publish ack JetStream sent there for "
                "a publisher that named it as its reply, or a request that wants no answer)."
            )
        if not answerable(token, msg.reply):
            raise ForeignReply(
                f"{storable(msg.subject)} names the reply subject {storable(msg.reply)}, "
                f"outside its tenant's inbox {TENANT_INBOX_ROOT}.{storable(token)}."
            )
        return await original(msg)

    def subscriber(command: cmd.Command) -> Callable[[Handler], Handler]:
        registered = router.subscriber(
            f"{{tenant}}.{command.name}",
            queue=QUEUE,
            parser=parsed,
            ack_policy=AckPolicy.MANUAL,  # core NATS: nothing to ack; the reply is the answer
            max_workers=workers,
            decoder=decoded,
            title=operation_name(command),
            description=f"{command.summary} (as `{command.http}`). Reply: `{command.reply.__name__}`, "
            f"or a `Problem`; the `{STATUS_HEADER}` header holds the HTTP status.",
        )
        return cast("Callable[[Handler], Handler]", registered)

    async def operator_only(msg: Msg, original: Parser) -> NatsMessage:
        """The ping, if its reply goes to an operator's client (no tenant may publish it at all)."""
        if not msg.reply.startswith(f"{OPERATOR_INBOX_ROOT}."):
            raise ForeignReply(f"a ping names the reply subject {storable(msg.reply)}, outside {OPERATOR_INBOX_ROOT}.")
        return await original(msg)

    @router.subscriber(
        layout.commands_ping[len(prefix) :],
        parser=operator_only,
        ack_policy=AckPolicy.MANUAL,  # core NATS: nothing to ack
        include_in_schema=False,  # the operator's, not a tenant's: not in the AsyncAPI document
    )
    async def ping() -> NatsResponse:
        """Readiness asks here whether a commands service answers (services/api/metrics.py). No
        queue group: every process answers, the first answer is enough; its own subscriber, so
        commands that fill every worker do not hold it back."""
        return reply({"pong": True})

    by = cmd.BY_NAME

    @subscriber(by["session.create"])
    async def create_session(body: cmd.CreateSession, tenant: str = Path()) -> NatsResponse:
        c = container()
        created, out = await writes.create_session(
            c, tenant_of(tenant), body.id, body.name, body.parent_session_id, body.metadata
        )
        return reply(out, 201 if created else 200)

    @subscriber(by["session.rename"])
    async def rename_session(body: cmd.RenameSession, tenant: str = Path()) -> NatsResponse:
        return reply(await writes.rename_session(container(), tenant_of(tenant), body.session_id, body.name))

    @subscriber(by["session.delete"])
    async def delete_session(body: cmd.DeleteSession, tenant: str = Path()) -> NatsResponse:
        return reply(await writes.delete_session(container(), tenant_of(tenant), body.session_id))

    @subscriber(by["session.usage"])
    async def add_usage(body: cmd.AddUsage, tenant: str = Path()) -> NatsResponse:
        _, out = await writes.add_usage(
            container(),
            tenant_of(tenant),
            body.session_id,
            body.input_tokens,
            body.output_tokens,
            body.cost,
            body.idempotency_key,
        )
        return reply(out)

    @subscriber(by["session.end"])
    async def end_session(body: cmd.EndSession, tenant: str = Path()) -> NatsResponse:
        return reply(await writes.end_session(container(), tenant_of(tenant), body.session_id, body.reason))

    @subscriber(by["session.fork"])
    async def fork_session(body: cmd.ForkSession, msg: NatsMessage, tenant: str = Path()) -> NatsResponse:
        t = tenant_of(tenant)
        out = await writes.fork_session(
            container(), t, body.session_id, body.at_message_id, body.id, body.name, charger(t, msg)
        )
        return reply(out, 201)

    @subscriber(by["append"])
    async def append(body: cmd.AppendMessage, tenant: str = Path()) -> NatsResponse:
        parent = writes.parent_spec(body.parent_id, "parent_id" in body.model_fields_set)
        out = await writes.append(
            container(), tenant_of(tenant), body.session_id, body.message, parent, body.idempotency_key
        )
        return reply(out, 201 if out["created"] else 200)

    @subscriber(by["append_batch"])
    async def append_batch(body: cmd.AppendBatch, msg: NatsMessage, tenant: str = Path()) -> NatsResponse:
        parent = writes.parent_spec(body.parent_id, "parent_id" in body.model_fields_set)
        t = tenant_of(tenant)
        out = await writes.append_batch(
            container(), t, body.session_id, body.messages, parent, body.idempotency_key, charger(t, msg)
        )
        return reply(out, 201)

    @subscriber(by["update"])
    async def update(body: cmd.UpdateMessage, tenant: str = Path()) -> NatsResponse:
        return reply(await writes.update_message(container(), tenant_of(tenant), body.session_id, None, body.message))

    @subscriber(by["delete"])
    async def delete(body: cmd.DeleteMessages, tenant: str = Path()) -> NatsResponse:
        return reply(await writes.delete_messages(container(), tenant_of(tenant), body.session_id, body.ids))

    @subscriber(by["clear"])
    async def clear(body: cmd.ClearMessages, tenant: str = Path()) -> NatsResponse:
        return reply(await writes.clear_messages(container(), tenant_of(tenant), body.session_id))

    @subscriber(by["compact"])
    async def compact(body: cmd.Compact, tenant: str = Path()) -> NatsResponse:
        return reply(await writes.compact(container(), tenant_of(tenant), body.session_id, body.leaf_id))

    @subscriber(by["config.put"])
    async def configure(body: cmd.Configure, tenant: str = Path()) -> NatsResponse:
        return reply(await writes.configure(container(), tenant_of(tenant), body.session_id, body.config))

    @subscriber(by["context.write"])
    async def write_context(body: cmd.WriteContext, tenant: str = Path()) -> NatsResponse:
        out = await writes.write_context(
            container(), tenant_of(tenant), body.session_id, body.label, body.content, body.mode
        )
        return reply(out)

    @subscriber(by["tool"])
    async def run_tool(body: cmd.RunTool, tenant: str = Path()) -> NatsResponse:
        out = await writes.run_tool(
            container(), tenant_of(tenant), body.session_id, body.name, body.arguments, body.tool_call_id
        )
        return reply(out)

    @subscriber(by["prompt.refresh"])
    async def refresh_prompt(body: cmd.RefreshPrompt, tenant: str = Path()) -> NatsResponse:
        return reply(await writes.refresh_prompt(container(), tenant_of(tenant), body.session_id))

    return router


def broker_for(settings: Settings, **options: Any) -> natsclient.Broker:
    """A FastStream broker that connects as Chronicle's operator identity, with its NATS client
    (:class:`services.natsclient.Broker`; per-message logs at
    DEBUG: a service answering thousands of requests a second logs what goes wrong, not each one)."""
    return natsclient.Broker(
        settings.nats_servers(),
        name="chronicle-commands",
        max_reconnect_attempts=-1,
        **STALE_DETECTION,
        reconnect_time_wait=1,
        middlewares=[problems()],
        logger=logging.getLogger("chronicle.commands.broker"),  # the process's log format, not FastStream's colours
        log_level=logging.DEBUG,
        security=nats_security(settings),
        **options,
    )


def command_broker(settings: Settings, container: ContainerOf) -> NatsBroker:
    """The broker of ``chronicle commands``: every command's subscriber, not yet connected."""
    broker = broker_for(settings)
    broker.include_router(
        command_router(settings.layout(), container, workers=settings.command_workers, limits=limits_of(settings))
    )
    return broker


@contextlib.asynccontextmanager
async def serving_commands(settings: Settings, container: Container) -> AsyncIterator[NatsBroker]:
    """Answer commands with ``container`` until the block exits (requests in flight finish first)."""
    broker = command_broker(settings, lambda: container)
    await broker.start()
    await broker.connection.flush()  # the server has the subscriptions: a request now finds responders
    try:
        yield broker
    finally:
        await brokers.stop(broker)
