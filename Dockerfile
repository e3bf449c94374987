# The Lading image: one image for every process (`lading operator`, `lading worker`, `lading api`, `lading relay`,
# `lading receiver`, `lading migrate`). Used by hack/kind-e2e.sh and the Helm chart.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY lading ./lading
COPY lading_demo ./lading_demo
COPY lading_elected ./lading_elected
COPY operator ./operator
COPY worker ./worker
COPY webhook_receiver ./webhook_receiver
COPY api ./api
COPY cli ./cli
RUN pip install . && rm -rf /src

# The chart runs as this user with a read-only root filesystem.
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin lading
USER 10001:10001
WORKDIR /

ENTRYPOINT ["lading"]
CMD ["--help"]
