# One image runs every KafScale component: kafscale broker | proxy | operator | local.
# Build from the repository root: docker build -t ghcr.io/kafscale/kafscale:0.1.0 .

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY broker ./broker
COPY operator ./operator
COPY pipeline ./pipeline
RUN pip install --prefix=/install .

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
COPY --from=build /install /usr/local
RUN groupadd --gid 10001 kafscale \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin kafscale
USER 10001:10001
WORKDIR /tmp
EXPOSE 9092 8080
ENTRYPOINT ["kafscale"]
CMD ["--help"]
