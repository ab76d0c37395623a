"""Authorization of every RPC a replica serves (docs/security.md).

One table says what each RPC is (`RPC_KINDS`: read, append, destroy, admin or peer); a role grants
kinds (`ROLE_GRANTS`); the roles file maps callers to roles: client certificates by subject
(the common name or any subject alternative name, shell-style patterns, first match in the
file's order) and bearer tokens (`authorization: Bearer <token>`, kept as SHA-256 digests
or as text). One gRPC server interceptor applies it to every call before any handler runs:
a refused call ends with PERMISSION_DENIED (UNAUTHENTICATED for an unknown token) and a
one-line reason, and has changed nothing.

Roles file (JSON; YAML when the name ends in .yaml/.yml):

    {"subjects": {"rlog-operator": "admin", "*.rlog-demo.default.svc": "peer",
                  "spark-*": "append"},
     "tokens": [{"name": "dashboards", "sha256": "<hex>", "role": "read"}],
     "default": "none"}

Without a roles file every caller may call anything (the transport alone decides who can
connect); the replica says so at start and in its Status.

Peers apart from clients: with a peer CA (`rlog replica --tls-peer-ca`, rlog.runtime.tls),
the roles peer and admin (`PEER_CA_ROLES`) go only to callers whose certificate the peer CA
issued: a rule or token giving them is skipped for any other caller, whatever names its
certificate carries. Without one, the names alone decide (Status `peer_trust: names`).

Identities the operator issues (`spec.auth.clients`, `kubectl rlog certificate`) are bound to
their certificates, not to a name: such a certificate carries the subject alternative name
`urn:rlog:client-identity:<name>` (`IDENTITY_URI_PREFIX`), and gets a role only from a
`certificates` entry listing its SHA-256 fingerprint (of the DER):

    "certificates": [{"name": "spark-reader", "role": "read", "sha256": ["<hex>", ...]}]

Name rules and the default never apply to it: once its entry is gone (revoked) or lists
other fingerprints (renewed, or another certificate of the same name), it has no role,
whatever `subjects` patterns its name matches.
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from rlog.config import ConfigError

log = logging.getLogger("rlog.authz")


class Kind(enum.Enum):
    """What an RPC does, as far as authorization goes."""

    READ = "read"  # reads the log or the replica's status
    APPEND = "append"  # adds to the log (appends, sessions)
    DESTROY = "destroy"  # takes from the log or from other writers (truncation, epochs)
    ADMIN = "admin"  # the operator's calls: permits, step-down
    PEER = "peer"  # the replication protocol between replicas


# Every RPC the replica serves, by its full gRPC method name. A method missing here is
# refused to every caller (tests/runtime/test_authz.py fails if the service has one that is).
RPC_KINDS: dict[str, Kind] = {
    "/rlog.v1.Replica/Promise": Kind.PEER,
    "/rlog.v1.Replica/Write": Kind.PEER,
    "/rlog.v1.Replica/WriteStream": Kind.PEER,
    "/rlog.v1.Replica/Learned": Kind.PEER,
    "/rlog.v1.Replica/Recover": Kind.PEER,
    "/rlog.v1.Replica/Fetch": Kind.PEER,
    "/rlog.v1.Log/Append": Kind.APPEND,
    "/rlog.v1.Log/AppendStream": Kind.APPEND,
    "/rlog.v1.Log/Truncate": Kind.DESTROY,  # drops every entry below a position
    "/rlog.v1.Log/TakeEpoch": Kind.DESTROY,  # fences every other writer's epoch
    "/rlog.v1.Log/OpenSession": Kind.APPEND,
    "/rlog.v1.Log/Read": Kind.READ,
    "/rlog.v1.Log/Tail": Kind.READ,
    "/rlog.v1.Log/Status": Kind.READ,
    "/rlog.v1.Admin/GrantPermit": Kind.ADMIN,
    "/rlog.v1.Admin/RevokePermit": Kind.ADMIN,
    "/rlog.v1.Admin/StepDown": Kind.ADMIN,
}

# What each role may call. `append` does not destroy: a writer that may add entries may
# not drop them or fence the other writers; `owner` may (the log's owner: compaction,
# retention, single-writer fencing). A peer also reads, appends and destroys: a replica
# forwards its clients' appends, truncations, epochs and reads to the leader under its own
# identity (the replica that received them authorized the client first). Admin is not
# given to peers.
ROLE_GRANTS: dict[str, frozenset[Kind]] = {
    "none": frozenset(),
    "read": frozenset({Kind.READ}),
    "append": frozenset({Kind.READ, Kind.APPEND}),
    "owner": frozenset({Kind.READ, Kind.APPEND, Kind.DESTROY}),
    "admin": frozenset({Kind.READ, Kind.APPEND, Kind.DESTROY, Kind.ADMIN}),
    "peer": frozenset({Kind.READ, Kind.APPEND, Kind.DESTROY, Kind.PEER}),
}

# The roles only a certificate of the peer CA may have when a peer CA is configured: the
# replication protocol and the operator's calls. A client CA signs whatever name a client
# asks for; its certificates must not become peers by carrying a replica's name.
PEER_CA_ROLES = frozenset({"peer", "admin"})

# The subject alternative name (URI) that marks a certificate the operator issued for a client
# identity: only its fingerprint gives it a role (`Policy.certificates`).
IDENTITY_URI_PREFIX = "urn:rlog:client-identity:"
# The roles a `certificates` entry may give: a client's, never a peer's or the operator's.
CERTIFICATE_ROLES = frozenset({"read", "append", "owner"})

# What a refusal adds for a caller whose role once allowed the call (roles files written
# before the destroy kind): what to change, in the same line.
_REFUSAL_HINTS: dict[tuple[Kind, str], str] = {
    (Kind.DESTROY, "append"): (
        " (role append no longer allows Truncate or TakeEpoch: "
        "give this caller role owner, docs/security.md)"
    ),
}


@dataclass(frozen=True)
class TokenRule:
    name: str
    digest: bytes  # SHA-256 of the token
    role: str


@dataclass(frozen=True)
class CertificateRule:
    """An identity the operator issued: the role of the certificates with these
    fingerprints (the current one, and the one before a renewal while it is still valid)."""

    name: str
    fingerprints: frozenset[str]  # SHA-256 of the DER, lowercase hex
    role: str


@dataclass(frozen=True)
class Policy:
    """Who gets which role."""

    subjects: tuple[tuple[str, str], ...] = ()  # (pattern, role), first match wins
    tokens: tuple[TokenRule, ...] = ()
    default: str = "none"  # the role of a caller no rule names
    source: str = ""  # where it was read from
    certificates: tuple[CertificateRule, ...] = ()

    def role_of_certificate(self, fingerprint: str) -> CertificateRule | None:
        return next((r for r in self.certificates if fingerprint in r.fingerprints), None)

    def role_of_subject(self, names: Iterable[str], peer_ca: bool = True) -> tuple[str, str] | None:
        """(role, name matched) of the first rule matching any of a certificate's names;
        without `peer_ca` (the certificate is not of the peer CA) rules giving a role of
        PEER_CA_ROLES are skipped."""
        names = list(names)
        for pattern, role in self.subjects:
            if not peer_ca and role in PEER_CA_ROLES:
                continue
            for name in names:
                if fnmatch.fnmatchcase(name, pattern):
                    return role, name
        return None

    def role_of_token(self, token: str) -> TokenRule | None:
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for rule in self.tokens:  # compare with every rule: no early exit to time
            if hmac.compare_digest(rule.digest, digest):
                found = rule
        return found


def _role(value: object, where: str) -> str:
    if not isinstance(value, str) or value not in ROLE_GRANTS:
        raise ConfigError(f"{where}: role {value!r} is not one of {', '.join(ROLE_GRANTS)}")
    return value


def parse_policy(data: object, source: str = "") -> Policy:
    """A Policy from a parsed roles file; ConfigError names what is wrong."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the roles file must hold an object")
    unknown = set(data) - {"subjects", "tokens", "default", "certificates"}
    if unknown:
        raise ConfigError(f"{source}: unknown keys {', '.join(sorted(unknown))}")
    subjects_data = data.get("subjects") or {}
    if not isinstance(subjects_data, dict):
        raise ConfigError(f"{source}: subjects must map a name (pattern) to a role")
    subjects = tuple(
        (str(pattern), _role(role, f"{source}: subject {pattern!r}"))
        for pattern, role in subjects_data.items()
    )
    tokens = []
    for i, entry in enumerate(data.get("tokens") or []):
        where = f"{source}: tokens[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: must be an object with name, role and token or sha256")
        if ("token" in entry) == ("sha256" in entry):
            raise ConfigError(f"{where}: give token or sha256 (one of them)")
        if "token" in entry:
            digest = hashlib.sha256(str(entry["token"]).encode()).digest()
        else:
            try:
                digest = bytes.fromhex(str(entry["sha256"]))
            except ValueError:
                raise ConfigError(f"{where}: sha256 is not hexadecimal") from None
            if len(digest) != 32:
                raise ConfigError(f"{where}: sha256 must be 64 hexadecimal digits")
        name = str(entry.get("name") or f"token {i}")
        tokens.append(TokenRule(name, digest, _role(entry.get("role"), where)))
    default = _role(data.get("default", "none"), f"{source}: default")
    return Policy(
        subjects,
        tuple(tokens),
        default,
        source,
        _certificate_rules(data.get("certificates"), source),
    )


def _certificate_rules(data: object, source: str) -> tuple[CertificateRule, ...]:
    if data is None:
        return ()
    if not isinstance(data, list):
        raise ConfigError(f"{source}: certificates must be a list")
    rules = []
    for i, entry in enumerate(data):
        where = f"{source}: certificates[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), list):
            raise ConfigError(f"{where}: must be an object with name, role and a sha256 list")
        role = _role(entry.get("role"), where)
        if role not in CERTIFICATE_ROLES:
            raise ConfigError(
                f"{where}: role {role!r}: an issued identity is one of "
                f"{', '.join(sorted(CERTIFICATE_ROLES))}"
            )
        digests = frozenset(str(d).lower() for d in entry["sha256"])
        if any(len(d) != 64 or not all(c in "0123456789abcdef" for c in d) for d in digests):
            raise ConfigError(f"{where}: sha256 must be 64 hexadecimal digits each")
        rules.append(CertificateRule(str(entry.get("name") or f"certificate {i}"), digests, role))
    return tuple(rules)


def load_policy(path: Path) -> Policy:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"--auth-config {path}: {exc.strerror or exc}") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ConfigError(f"--auth-config {path}: YAML needs pyyaml; use JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--auth-config {path}: not valid YAML: {_one_line(exc)}") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"--auth-config {path}: not valid JSON: {exc}") from None
    return parse_policy(data, str(path))


def _one_line(error: object) -> str:
    return " ".join(str(error).split())


class PolicyFile:
    """The roles file, read again when it changes (looked at no more than once a second):
    a changed file that does not parse is not taken, and the roles in force stay."""

    CHECK_INTERVAL = 1.0

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = self._stat()
        self.policy = load_policy(path)
        self._checked = time.monotonic()
        self.reloads = 0

    def _stat(self) -> tuple[int, int]:
        info = self.path.stat()
        return info.st_mtime_ns, info.st_size

    def current(self) -> Policy:
        now = time.monotonic()
        if now - self._checked < self.CHECK_INTERVAL:
            return self.policy
        self._checked = now
        try:
            stamp = self._stat()
        except OSError as exc:
            log.warning("cannot look at the roles file; keeping the roles: %s", exc)
            return self.policy
        if stamp == self._stamp:
            return self.policy
        self._stamp = stamp  # a bad file is reported once, not at every call
        try:
            self.policy = load_policy(self.path)
        except ConfigError as exc:
            log.warning("the roles file changed but cannot be used; keeping the roles: %s", exc)
            return self.policy
        self.reloads += 1
        log.info("reloaded the roles from %s", self.path)
        return self.policy


@dataclass(frozen=True)
class Caller:
    """Who a call comes from, as the transport and metadata say."""

    names: tuple[str, ...] = ()  # the client certificate's common name and SANs
    token: str | None = None  # the bearer token, if one was sent
    peer: str = ""  # the address, for the reason text
    # Whether the peer CA issued the certificate; None: no peer CA is configured (the
    # names alone decide, as before there was one).
    from_peer_ca: bool | None = None
    fingerprint: str = ""  # the certificate's SHA-256 (of the DER), lowercase hex
    issued_identity: bool = False  # it carries IDENTITY_URI_PREFIX: its fingerprint decides


@dataclass(frozen=True)
class Decision:
    allowed: bool
    code: grpc.StatusCode = grpc.StatusCode.OK
    reason: str = ""
    roles: tuple[str, ...] = field(default=())


def decide(policy: Policy, method: str, caller: Caller) -> Decision:
    """Whether `caller` may call `method`, and a one-line reason if not. Pure."""
    kind = RPC_KINDS.get(method)
    if kind is None:
        return Decision(False, grpc.StatusCode.PERMISSION_DENIED, f"{method} is not authorized")
    roles: list[str] = []
    who: list[str] = []
    peer_ca = caller.from_peer_ca is not False
    if caller.token is not None:
        rule = policy.role_of_token(caller.token)
        if rule is None:
            return Decision(False, grpc.StatusCode.UNAUTHENTICATED, "unknown bearer token")
        if peer_ca or rule.role not in PEER_CA_ROLES:
            roles.append(rule.role)
            who.append(f"token {rule.name!r}")
    if caller.issued_identity:
        # An identity the operator issued: its fingerprint alone gives it a role; a revoked
        # or replaced one matches no entry and falls to no name rule and no default.
        issued = policy.role_of_certificate(caller.fingerprint)
        roles.append(issued.role if issued is not None else "none")
        who.append(
            f"certificate {issued.name!r}"
            if issued is not None
            else f"issued certificate {caller.names[0] if caller.names else ''!r} "
            "(revoked or replaced: its fingerprint is in no certificates entry)"
        )
    else:
        by_subject = policy.role_of_subject(caller.names, peer_ca)
        if by_subject is not None:
            roles.append(by_subject[0])
            who.append(f"certificate {by_subject[1]!r}")
    if not roles:
        roles.append(policy.default)
        who.append(
            f"certificate {caller.names[0]!r} (no rule names it)"
            if caller.names
            else "an anonymous caller"
        )
    if not peer_ca and kind in (Kind.PEER, Kind.ADMIN):
        who[-1] += " (not issued by the peer CA: never a peer or admin)"
    if any(kind in ROLE_GRANTS[role] for role in roles):
        return Decision(True, roles=tuple(roles))
    name = method.rsplit("/", 1)[-1]
    hint = next((_REFUSAL_HINTS[kind, r] for r in roles if (kind, r) in _REFUSAL_HINTS), "")
    return Decision(
        False,
        grpc.StatusCode.PERMISSION_DENIED,
        f"{name} needs a role allowing {kind.value} calls; {' and '.join(who)} "
        f"has role {'/'.join(roles)}{hint}",
        tuple(roles),
    )


# Whether the peer CA issued a certificate (PEM); None: no peer CA is configured.
PeerCheck = Callable[[bytes], bool]

_IDENTITIES: dict[bytes, tuple[str, bool]] = {}
_IDENTITIES_KEPT = 1024


def certificate_identity(certificate: bytes) -> tuple[str, bool]:
    """(SHA-256 fingerprint of the DER in lowercase hex, whether it is an identity the
    operator issued: a URI name starting with IDENTITY_URI_PREFIX) of a certificate, PEM or
    DER; ("", False) if it does not parse. Kept for the certificates seen last (the same
    certificate calls again and again)."""
    known = _IDENTITIES.get(certificate)
    if known is not None:
        return known
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        if certificate.lstrip().startswith(b"-----BEGIN"):
            cert = x509.load_pem_x509_certificate(certificate)
        else:
            cert = x509.load_der_x509_certificate(certificate)
    except ValueError:
        return "", False
    der = cert.public_bytes(serialization.Encoding.DER)
    try:
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = alt.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    found = (hashlib.sha256(der).hexdigest(), any(u.startswith(IDENTITY_URI_PREFIX) for u in uris))
    if len(_IDENTITIES) >= _IDENTITIES_KEPT:
        _IDENTITIES.clear()
    _IDENTITIES[certificate] = found
    return found


def caller_of(
    context: grpc.aio.ServicerContext, peer_check: Callable[[], PeerCheck | None] | None = None
) -> Caller:
    """The caller of a call: its certificate's names (mutual TLS), bearer token and whether
    the peer CA issued its certificate."""
    auth = context.auth_context() or {}
    check = peer_check() if peer_check is not None else None
    pem = next(iter(auth.get("x509_pem_cert", ())), b"")  # the caller's leaf certificate
    from_peer_ca = None
    if check is not None:
        from_peer_ca = bool(pem) and check(pem)
    fingerprint, issued = certificate_identity(pem) if pem else ("", False)
    names: list[str] = []
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in auth.get(key, ()):
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            if text not in names:
                names.append(text)
    token = None
    for key, item in context.invocation_metadata() or ():
        if key == "authorization":
            header = item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
            scheme, _, rest = header.partition(" ")
            token = rest.strip() if scheme.lower() == "bearer" else ""
    return Caller(tuple(names), token, context.peer(), from_peer_ca, fingerprint, issued)


def caller_of_tls(
    names: tuple[str, ...], der: bytes | None, peer: str, check: PeerCheck | None
) -> Caller:
    """The caller on a TLS connection that is not gRPC (the write lane): its certificate's
    names and DER, and the peer CA's check in force (None: no peer CA)."""
    from_peer_ca = None if check is None else der is not None and check(der)
    fingerprint, issued = certificate_identity(der) if der else ("", False)
    return Caller(names, None, peer, from_peer_ca, fingerprint, issued)


Handler = Callable[..., Any]


class AuthorizationInterceptor(grpc.aio.ServerInterceptor):
    """Checks every call against the policy before its handler runs; `peer_check` gives the
    peer CA's check in force (None: no peer CA)."""

    def __init__(
        self,
        roles: PolicyFile | Policy,
        peer_check: Callable[[], PeerCheck | None] | None = None,
    ) -> None:
        self._roles = roles
        self._peer_check = peer_check
        self.denied = 0

    @property
    def policy(self) -> Policy:
        return self._roles.current() if isinstance(self._roles, PolicyFile) else self._roles

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return self._guarded(handler, handler_call_details.method)

    async def _check(self, method: str, context: grpc.aio.ServicerContext) -> None:
        decision = decide(self.policy, method, caller_of(context, self._peer_check))
        if not decision.allowed:
            self.denied += 1
            log.info("denied %s from %s: %s", method, context.peer(), decision.reason)
            await context.abort(decision.code, decision.reason)

    def _guarded(self, given: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        # The servicers are grpc.aio ones: each behaviour is a coroutine function or an
        # async generator function (the stubs type them as the blocking API's).
        handler: Any = given
        check = self._check
        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await check(method, context)
                return await inner_uu(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            async def unary_stream(
                request: Any, context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                await check(method, context)
                async for response in inner_us(request, context):
                    yield response

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, handler.request_deserializer, handler.response_serializer
            )
        if handler.stream_unary is not None:
            inner_su = handler.stream_unary

            async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                await check(method, context)
                return await inner_su(requests, context)

            return grpc.stream_unary_rpc_method_handler(
                stream_unary, handler.request_deserializer, handler.response_serializer
            )
        inner_ss = handler.stream_stream

        async def stream_stream(
            requests: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            await check(method, context)
            async for response in inner_ss(requests, context):
                yield response

        return grpc.stream_stream_rpc_method_handler(
            stream_stream, handler.request_deserializer, handler.response_serializer
        )
