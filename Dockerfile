# syntax=docker/dockerfile:1
# Chronicle's processes (api, projector, migrate, keygen, ...) in one image: `chronicle <command>`.
#   docker build -t chronicle .
#   docker run --rm chronicle keygen --tenant acme
# compose.yaml runs the whole stack from this image.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/chronicle
WORKDIR /src
# Only what the wheels are built from (see .dockerignore); no dev extras. Two distributions:
# chronicle-sdk (sdk/pyproject.toml: chronicle_sdk/ and events/) and chronicle, which depends on it.
COPY pyproject.toml README.md ./
COPY sdk ./sdk
COPY events ./events
COPY projections ./projections
COPY services ./services
COPY chronicle_sdk ./chronicle_sdk
RUN /opt/chronicle/bin/pip install ./sdk .

FROM python:3.11-slim
# The venv is copied to the same path on the same base image, so its interpreter links stay valid.
COPY --from=build /opt/chronicle /opt/chronicle
ENV PATH=/opt/chronicle/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CHRONICLE_API_HOST=0.0.0.0 \
    CHRONICLE_API_PORT=8080
RUN groupadd --system --gid 10001 chronicle \
    && useradd --system --uid 10001 --gid chronicle --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin chronicle \
    && mkdir -p /app /conf \
    && chown chronicle:chronicle /app /conf
# /conf: where `chronicle nats-config` writes the nats-server configuration (a volume in compose.yaml)
WORKDIR /app
USER 10001:10001
EXPOSE 8080
# exec form: chronicle is PID 1 and gets SIGTERM directly (the API and the projector stop cleanly on it).
ENTRYPOINT ["chronicle"]
CMD ["api"]
