# PostgreSQL for docker/compose.yaml where no registry serves postgres:17-alpine (the air-gapped
# build, scripts/offline_images.sh): Debian's postgresql-15 on the debootstrap base image, with
# the official image's interface that compose.yaml uses (POSTGRES_USER, POSTGRES_DB,
# POSTGRES_PASSWORD; data in /var/lib/postgresql/data; pg_isready). docker/compose.offline.yaml
# puts it in the stack.
#
#   docker build -f docker/postgres.Dockerfile --build-arg BASE_IMAGE=commhooks-base:bookworm \
#                -t commhooks-postgres:15 docker
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Debian's PostgreSQL 15 of this base, whatever its point release (hence DL3008 off here); the
# user is made first with the official image's uid (999); the package's own cluster is dropped: the entrypoint makes one in the volume.
# hadolint ignore=DL3008
RUN groupadd --system --gid 999 postgres \
 && useradd --system --uid 999 --gid postgres --home-dir /var/lib/postgresql postgres \
 && apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* /var/lib/postgresql/15 /etc/postgresql/15/main \
 && mkdir -p /var/lib/postgresql/data /run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /run/postgresql \
 && chmod 700 /var/lib/postgresql/data

ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data

COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh

# numeric, the official image's uid
USER 999:999
EXPOSE 5432
CMD ["/usr/local/bin/postgres-entrypoint.sh"]
