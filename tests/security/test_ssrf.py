"""A tenant's tool hosts cannot point ``http_fetch`` at the worker's own network (SSRF).

Attacks as reported: numeric aliases of internal addresses (``1681915905`` is 100.64.0.1,
``2130706433``/``0x7f000001``/``0177.0.0.1``/``127.1`` are 127.0.0.1, ``2852039166`` is the
metadata address), IPv6 forms wrapping an IPv4 address, ``localhost`` names, and a DNS answer that
changes between the worker's check and its connection (rebinding).

* ``PUT /tool-hosts`` refuses each with a 400 in the error envelope naming the entry and why.
* The worker's brokered I/O (``gpu_worker/brokered_io.py``), driven directly with the process's
  resolver answering for a public-looking name (no DNS exists here), refuses a name that resolves
  to any internal address, resolves once, and connects to the address it checked, over TLS with
  the name as SNI and verified against the name's certificate.
* The real worker process refuses the aliases to a LIP as ``PermissionDenied``.

No packet leaves loopback: connections to other addresses are refused by the test's network
(``connect`` on a socket), except the one public address the test routes to a local server.
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpu_worker import address_policy, brokered_io
from gpu_worker.protocol import ErrorCode, HttpFetch, ProtocolError

NAME = "tools.example.com"
PUBLIC = "93.184.215.14"  # a public address the test's network routes to a local server


# --- the helper, over a table -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "canonical"),
    [
        ("1681915905", "100.64.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0X7F000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("2852039166", "169.254.169.254"),
        ("0xa9fea9fe", "169.254.169.254"),
        ("0251.0376.0251.0376", "169.254.169.254"),
        ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"),
        ("0", "0.0.0.0"),
        ("134744072", "8.8.8.8"),
        ("Tools.Example.COM.", "tools.example.com"),
        ("Bücher.example", "xn--bcher-kva.example"),
        ("[::FFFF:127.0.0.1]", "::ffff:7f00:1"),
        ("2606:4700:0::1111", "2606:4700::1111"),
    ],
)
def test_canonical_host_reads_numeric_aliases_as_inet_aton_does(host: str, canonical: str) -> None:
    assert address_policy.canonical_host(host) == canonical
    if address_policy.ip_literal(canonical) is not None and ":" not in canonical:
        assert canonical == socket.inet_ntoa(socket.inet_aton(host.lower()))  # the C library agrees


@pytest.mark.parametrize("host", ["1.2.3.4.5", "08.0.0.1", "1.256.0.1", "4294967296", "[tools.example.com]", "a..b"])
def test_canonical_host_refuses_what_names_nothing(host: str) -> None:
    with pytest.raises(ValueError, match=r"is not|is neither"):
        address_policy.canonical_host(host)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "CGNAT"),
        ("100.127.255.254", "CGNAT"),
        ("169.254.169.254", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "private"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("fd00::1", "private"),
        ("ff02::1", "multicast"),
        ("ff0e::1", "multicast"),
        ("::ffff:127.0.0.1", "embeds 127.0.0.1, a loopback"),
        ("::ffff:7f00:1", "embeds 127.0.0.1, a loopback"),
        ("::ffff:100.64.0.1", "embeds 100.64.0.1, a shared (CGNAT"),
        ("::127.0.0.1", "embeds 127.0.0.1, a loopback"),
        ("2002:7f00:1::", "embeds 127.0.0.1, a loopback"),
        ("2002:a9fe:a9fe::1", "embeds 169.254.169.254, a link-local"),
        ("64:ff9b::7f00:1", "embeds 127.0.0.1, a loopback"),
        ("64:ff9b::a9fe:a9fe", "embeds 169.254.169.254, a link-local"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "embeds 127.0.0.1, a loopback"),  # Teredo
        ("not-an-address", "not an IP address"),
    ],
)
def test_refusal_names_why_an_address_is_internal(address: str, why: str) -> None:
    reason = address_policy.refusal(address)
    assert reason is not None and why in reason


@pytest.mark.parametrize(
    "address", ["8.8.8.8", PUBLIC, "2606:4700::1111", "::ffff:8.8.8.8", "2002:808:808::", "64:ff9b::808:808"]
)
def test_refusal_lets_public_addresses_through_even_wrapped(address: str) -> None:
    assert address_policy.refusal(address) is None


# --- PUT /tool-hosts ----------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("1681915905", "100.64.0.1 is a shared (CGNAT"),
        ("2130706433", "127.0.0.1 is a loopback"),
        ("0x7f000001", "127.0.0.1 is a loopback"),
        ("0177.0.0.1:6379", "127.0.0.1 is a loopback"),
        ("127.1", "127.0.0.1 is a loopback"),
        ("2852039166", "169.254.169.254 is a link-local"),
        ("0xa9fea9fe", "169.254.169.254 is a link-local"),
        ("0251.0376.0251.0376", "169.254.169.254 is a link-local"),
        ("100.64.0.1", "CGNAT"),
        ("0", "0.0.0.0 is the unspecified"),
        ("[::ffff:127.0.0.1]", "embeds 127.0.0.1, a loopback"),
        ("[::ffff:7f00:1]:8080", "embeds 127.0.0.1, a loopback"),
        ("::ffff:127.0.0.1", "embeds 127.0.0.1, a loopback"),
        ("[2002:7f00:1::]", "embeds 127.0.0.1, a loopback"),
        ("[64:ff9b::7f00:1]", "embeds 127.0.0.1, a loopback"),
        ("[::127.0.0.1]", "embeds 127.0.0.1, a loopback"),
        ("[::1]", "loopback"),
        ("localhost", "localhost names this machine"),
        ("LocalHost.", "localhost names this machine"),
        ("foo.localhost:8080", "localhost names this machine"),
    ],
)
def test_put_tool_hosts_refuses_every_spelling_of_an_internal_address(api_tenant_a, entry: str, why: str) -> None:
    response = api_tenant_a.session_client().put("/api/v1/tool-hosts", {"hosts": [entry]}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert entry in error["message"] and "internal address" in error["message"] and why in error["message"]
    api_tenant_a.tenant.refresh_from_db()
    assert api_tenant_a.tenant.allowed_tool_hosts == []


@pytest.mark.django_db
def test_put_tool_hosts_stores_public_hosts_in_one_spelling(api_tenant_a) -> None:
    hosts = ["134744072", "Tools.Example.COM.", "Bücher.example:8443", "[2606:4700:0::1111]:8443", "2606:4700::1001"]
    response = api_tenant_a.session_client().put("/api/v1/tool-hosts", {"hosts": hosts}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["hosts"] == [
        "8.8.8.8",
        "tools.example.com",
        "xn--bcher-kva.example:8443",
        "[2606:4700::1111]:8443",
        "[2606:4700::1001]",
    ]


# --- the worker's brokered I/O, against a resolver and network the test controls ---------------


def _info(address: str, port: int) -> tuple:
    if ":" in address:
        return (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))
    return (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))


@dataclass
class Network:
    """The process's resolver and network as the test sets them: ``answers[name]`` is the list
    of answers the resolver gives in turn (the last one repeats), ``routes`` send a public
    ``(address, port)`` to a local server, and every other non-loopback connect is refused."""

    answers: dict[str, list[list[str]]] = field(default_factory=dict)
    routes: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    lookups: list[str] = field(default_factory=list)
    connects: list[tuple[str, int]] = field(default_factory=list)


@pytest.fixture
def network(monkeypatch: pytest.MonkeyPatch) -> Network:
    net = Network()
    real_getaddrinfo = socket.getaddrinfo
    real_connect = socket.socket.connect

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list:
        if host not in net.answers:
            return real_getaddrinfo(host, port, *args, **kwargs)
        net.lookups.append(host)
        turns = net.answers[host]
        answer = turns.pop(0) if len(turns) > 1 else turns[0]
        return [_info(a, int(port)) for a in answer]

    def connect(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            net.connects.append((address[0], address[1]))
            target = net.routes.get((address[0], address[1]))
            if target is not None:
                return real_connect(sock, target)
            if not ipaddress.ip_address(address[0]).is_loopback:
                raise ConnectionRefusedError(111, "no route outside loopback in this test")
        return real_connect(sock, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    return net


def _fetch(url: str, allowed_hosts: list[str]) -> Any:
    req = brokered_io.parse_request(HttpFetch(url=url, timeout=5.0), 5.0)
    dest = brokered_io.check_allowed(req, allowed_hosts)
    return brokered_io.fetch(req, dest, 1 << 20)


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (["100.64.0.1"], "100.64.0.1 is a shared (CGNAT"),
        (["::ffff:127.0.0.1"], "embeds 127.0.0.1, a loopback"),
        (["::127.0.0.1"], "embeds 127.0.0.1, a loopback"),
        (["64:ff9b::a9fe:a9fe"], "embeds 169.254.169.254, a link-local"),
        (["2002:7f00:1::"], "embeds 127.0.0.1, a loopback"),
        (["169.254.169.254"], "169.254.169.254 is a link-local"),
        ([PUBLIC, "100.64.0.1"], "100.64.0.1 is a shared (CGNAT"),  # every address is checked
    ],
)
def test_a_listed_name_resolving_to_an_internal_address_is_refused(network: Network, answer, why) -> None:
    network.answers[NAME] = [answer]
    with pytest.raises(ProtocolError) as refused:
        _fetch(f"http://{NAME}/", [NAME])
    assert refused.value.code == ErrorCode.PERMISSION
    message = refused.value.message
    assert message.startswith(f"host {NAME} resolves to an internal address: ") and why in message
    assert network.connects == []


def _certificate(tmp: Path, ca: Any, ca_key: Any, name: str) -> tuple[Path, Path]:
    """A certificate for ``name`` signed by the test CA, as (cert, key) PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = tmp / f"{name}.pem", tmp / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture
def tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], tuple[Path, Path]]:
    """A test CA the process trusts (``SSL_CERT_FILE``), and certificates for names from it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "symphony test CA")])
    now = datetime.datetime.now(datetime.UTC)
    ca = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path = tmp_path / "ca.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_path))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    return lambda name: _certificate(tmp_path, ca, ca_key, name)


@dataclass
class Server:
    """A local HTTPS server answering ``body``, recording each request's SNI and Host header."""

    port: int
    requests: list[tuple[str | None, str | None]]


@pytest.fixture
def https_server() -> Iterator[Callable[[tuple[Path, Path], bytes], Server]]:
    started: list[http.server.ThreadingHTTPServer] = []

    def start(cert: tuple[Path, Path], body: bytes) -> Server:
        requests: list[tuple[str | None, str | None]] = []
        sni: dict[int, str | None] = {}
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*cert)
        context.sni_callback = lambda sslsock, name, ctx: sni.__setitem__(id(sslsock), name)  # type: ignore[assignment,func-returns-value]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                requests.append((sni.get(id(self.connection)), self.headers.get("Host")))
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        started.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return Server(server.server_address[1], requests)

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def test_dns_rebinding_after_the_check_does_not_redirect_an_https_fetch(network: Network, tls, https_server) -> None:
    """The name first resolves to a public address (checked, allowed), then to 127.0.0.1, where
    an internal service listens on the URL's port. The fetch reaches the public host: TCP to the
    checked address, TLS with the name as SNI and verified against the name's certificate."""
    internal = https_server(tls(NAME), b"internal secrets")
    public = https_server(tls(NAME), b"public tool")
    network.answers[NAME] = [[PUBLIC], ["127.0.0.1"]]
    network.routes[(PUBLIC, internal.port)] = ("127.0.0.1", public.port)

    reply = _fetch(f"https://{NAME}:{internal.port}/", [f"{NAME}:{internal.port}"])

    assert (reply.status, reply.body) == (200, b"public tool")
    assert internal.requests == []
    assert public.requests == [(NAME, f"{NAME}:{internal.port}")]
    assert network.lookups == [NAME]  # resolved once
    assert network.connects == [(PUBLIC, internal.port)]


def test_the_pinned_https_connection_still_verifies_the_name_s_certificate(network: Network, tls, https_server) -> None:
    """Connecting to an address does not weaken TLS: a certificate for another name is refused."""
    internal = https_server(tls(NAME), b"internal secrets")
    impostor = https_server(tls("other.example"), b"impostor")
    network.answers[NAME] = [[PUBLIC], ["127.0.0.1"]]
    network.routes[(PUBLIC, internal.port)] = ("127.0.0.1", impostor.port)

    with pytest.raises(ProtocolError) as failed:
        _fetch(f"https://{NAME}:{internal.port}/", [f"{NAME}:{internal.port}"])

    assert failed.value.code == ErrorCode.IO and "CERTIFICATE_VERIFY_FAILED" in failed.value.message
    assert impostor.requests == [] and internal.requests == []
    assert network.connects == [(PUBLIC, internal.port)]


# --- the real worker process --------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_the_worker_refuses_aliases_of_internal_addresses_to_a_lip(gpu_worker_process) -> None:
    """Entries stored before the API refused them (or set by a run's limits) do not reach the
    worker's network: each alias is resolved by the C library and its address refused."""
    import symphony as sy

    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cases = {  # the loopback ones first: before the fix the first reached the local server
        f"[::ffff:127.0.0.1]:{port}": "embeds 127.0.0.1, a loopback",
        f"2130706433:{port}": "127.0.0.1 is a loopback",
        f"0x7f000001:{port}": "127.0.0.1 is a loopback",
        f"127.1:{port}": "127.0.0.1 is a loopback",
        f"localhost:{port}": "localhost names this machine",
        "2852039166": "169.254.169.254 is a link-local",
        "1681915905:9": "100.64.0.1 is a shared (CGNAT",
    }
    allowed = [*cases, f"::ffff:127.0.0.1:{port}"]
    try:
        with gpu_worker_process.session(allowed_hosts=allowed) as info:
            session = sy.connect(info.socket_path, info.token)
            for entry, why in cases.items():
                with pytest.raises(sy.PermissionDenied) as refused:
                    session.http_fetch(f"http://{entry}/probe", timeout=3)
                assert "internal address" in str(refused.value) and why in str(refused.value), (entry, refused.value)
    finally:
        server.shutdown()
        server.server_close()
    assert hits == []
