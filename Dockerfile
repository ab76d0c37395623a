# The rlog operator image. Build from the repository root:
#   docker build -t docker.io/rlog/rlog-operator:dev .
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A venv works the same on the official python image and on Debian's python3 (PEP 668).
RUN python3 -m venv /opt/rlog
COPY . /src
RUN /opt/rlog/bin/pip install --no-cache-dir /src && rm -rf /src
ENV PATH=/opt/rlog/bin:$PATH
USER 65532:65532
ENTRYPOINT ["rlog-operator"]
