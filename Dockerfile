# Two images of the phalanx binary, for the Kubernetes manifests in
# deploy/k8s (docs/kubernetes.md):
#
#   docker build --target static   -t phalanx:dev .   # pure Go (CGO_ENABLED=0) on distroless/static
#   docker build --target openblas -t phalanx:dev .   # nn/ on OpenBLAS (cgo) on Debian bookworm;
#                                                     # the default target, 7-8x faster matrix products
#
# Both run as the non-root user 65532 with the binary at
# /usr/local/bin/phalanx, the command the manifests run
# (TestK8sImageEntrypoint holds them together). Give --build-arg
# VERSION=v1.2.3 for `phalanx version`.

ARG GO_VERSION=1.26

# The static binary: gonum's pure-Go BLAS, no libc.
FROM golang:${GO_VERSION}-bookworm AS build-static
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags="-s -w -X main.version=${VERSION}" \
      -o /out/phalanx ./cmd/phalanx

# distroless/static: CA certificates (for an https S3), /etc/passwd with
# the nonroot user, nothing else.
FROM gcr.io/distroless/static-debian12:nonroot AS static
COPY --from=build-static /out/phalanx /usr/local/bin/phalanx
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/phalanx"]

# The OpenBLAS binary: Debian's OpenBLAS through cgo (-tags openblas).
FROM golang:${GO_VERSION}-bookworm AS build-openblas
RUN apt-get update \
 && apt-get install -y --no-install-recommends libopenblas-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=1 go build -trimpath -buildvcs=false -tags openblas -ldflags="-s -w -X main.version=${VERSION}" \
      -o /out/phalanx ./cmd/phalanx

# Debian bookworm with the OpenBLAS run-time library alone.
FROM debian:bookworm-slim AS openblas
RUN apt-get update \
 && apt-get install -y --no-install-recommends libopenblas0 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nonroot
COPY --from=build-openblas /out/phalanx /usr/local/bin/phalanx
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/phalanx"]
