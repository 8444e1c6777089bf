"""The bearer-token flow against the real registry with ``auth: token`` configured.

public.ecr.aws answers an anonymous HEAD with ``401`` + ``WWW-Authenticate: Bearer realm=...,
service=...,scope=...``. Here the same docker-registry binary runs with token auth over the
session's storage; the token service is a few lines of http.server that signs an ES256 JWT the
REGISTRY verifies (x5c chain against its rootcertbundle, issuer, audience, expiry, scope), so a
wrong realm/service/scope handling in our client fails the test.
"""
from __future__ import annotations

import base64
import datetime
import http.server
import json
import socketserver
import threading
import time
import urllib.parse

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from oci_registry import start_registry, stop
from infra.lambdas.image_watcher.registry import ImageLocation, RegistryError, resolve_digest

SERVICE = "raytrain-test-registry"
ISSUER = "raytrain-test-issuer"
NAME = "deep-learning-containers/ray"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenService:
    """Signs registry tokens for whatever scope is asked, and records the requests."""

    def __init__(self):
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raytrain test token signer")])
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(hours=1))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.requests: list[dict[str, str]] = []
        self.refuse = False

    def token(self, scope: str) -> str:
        header = {"typ": "JWT", "alg": "ES256",
                  "x5c": [base64.b64encode(self.cert.public_bytes(serialization.Encoding.DER)).decode()]}
        kind, name, actions = scope.split(":")
        now = int(time.time())
        claims = {"iss": ISSUER, "sub": "", "aud": SERVICE, "exp": now + 300, "nbf": now - 10,
                  "iat": now, "jti": str(now),
                  "access": [{"type": kind, "name": name, "actions": actions.split(",")}]}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing_input}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory, registry, pushed):
    service = TokenService()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
            service.requests.append(query)
            if service.refuse:
                self.send_response(403)
                self.end_headers()
                return
            body = json.dumps({"token": service.token(query["scope"])}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    workdir = tmp_path_factory.mktemp("token-registry")
    bundle = workdir / "signer.pem"
    bundle.write_bytes(service.cert.public_bytes(serialization.Encoding.PEM))
    realm = f"http://127.0.0.1:{server.server_address[1]}/token"
    proc, url = start_registry(workdir, data_dir=registry.data_dir, extra_config=(
        f"auth:\n  token:\n    realm: {realm}\n    service: {SERVICE}\n"
        f"    issuer: {ISSUER}\n    rootcertbundle: {bundle}\n"))
    yield url, service
    stop(proc)
    server.shutdown()
    server.server_close()


def test_anonymous_bearer_token_flow_resolves_the_digest(token_registry, pushed):
    url, service = token_registry
    service.requests.clear()
    # when the registry challenges, the client asks the realm for a pull token of this repository
    digest = resolve_digest(ImageLocation(registry_url=url, name=NAME, tag="train-ml-cuda-v1.1.0"))
    # then the registry accepted the token and answered with the digest computed at push time
    assert digest == pushed["v1"]
    assert service.requests == [{"service": SERVICE, "scope": f"repository:{NAME}:pull"}]


def test_a_refused_token_is_one_line(token_registry):
    url, service = token_registry
    service.refuse = True
    try:
        with pytest.raises(RegistryError, match=r"^token refused by http://127\.0\.0\.1:\d+/token .*HTTP 403\)$"):
            resolve_digest(ImageLocation(registry_url=url, name=NAME, tag="train-ml-cuda-v1.1.0"))
    finally:
        service.refuse = False
