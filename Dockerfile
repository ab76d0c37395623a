# The rlog operator image. Build from the repository root:
#   docker build -t docker.io/rlog/rlog-operator:dev .
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A venv works the same on the official python image and on Debian's python3 (PEP 668).
RUN python3 -m venv /opt/rlog
# Dependencies (the package's, the [operator] extra's, the build requirements) first, from
# pyproject.toml alone: this layer stays cached while only the sources change.
COPY pyproject.toml constraints.txt /src/
RUN python3 -c "import tomllib; t = tomllib.load(open('/src/pyproject.toml', 'rb')); p = t['project']; \
print('\n'.join(t['build-system']['requires'] + p['dependencies'] + p['optional-dependencies']['operator']))" \
    > /tmp/requirements.txt \
 && /opt/rlog/bin/pip install --no-cache-dir -c /src/constraints.txt -r /tmp/requirements.txt && rm /tmp/requirements.txt
# README.md is the package's readme; the pattern keeps the build working before it exists
COPY pyproject.toml README.m[d] /src/
COPY replica_image/rlog /src/replica_image/rlog
COPY operator/rlog_operator /src/operator/rlog_operator
RUN /opt/rlog/bin/pip install --no-cache-dir --no-deps --no-build-isolation /src && rm -rf /src
ENV PATH=/opt/rlog/bin:$PATH
USER 65532:65532
ENTRYPOINT ["rlog-operator"]
