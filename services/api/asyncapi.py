"""The AsyncAPI document of events and commands on NATS (services/commands_nats/asyncapi.py), for
this server's settings: its subjects, stream and NATS servers."""

from fastapi import APIRouter, Request, Response

from services.api.deps import ContainerDep
from services.commands_nats.asyncapi import render

router = APIRouter()
YAML = "application/yaml"


@router.get("/asyncapi.yaml", response_class=Response, responses={200: {"content": {YAML: {}}}})
async def asyncapi(request: Request, c: ContainerDep) -> Response:
    """Every event type (subject pattern, schema, version) and every command subject with its
    request and reply; docs/asyncapi.yaml is the same for the default settings."""
    text: str | None = getattr(request.app.state, "asyncapi", None)
    if text is None:
        text = request.app.state.asyncapi = render(c.settings)
    return Response(text, media_type=YAML)
