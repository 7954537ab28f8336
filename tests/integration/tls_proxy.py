"""A TLS-terminating proxy in front of a real redis-server, with certificates the test makes.

The embedded redis-server has no TLS, so ``TLSProxy`` provides it: it listens on a
loopback port, completes a TLS handshake with each client (server side, on the
standard ``ssl`` module), then opens a plain TCP connection to its node and copies bytes
both ways, one thread per connection. Its handshake can be made slow
(``handshake_delay``, what a TLS node far away or under load looks like to a client) or
held until the test lets it go (``hold``/``release``: a node whose set-up never ends).

``CertificateAuthority`` makes a CA for one test and issues server certificates for the
names given (IP addresses or host names), with the ``cryptography`` package; clients
verify the proxy by passing the CA's file as ``ssl_ca_certs``.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import select
import socket
import ssl
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .loopback import HOST, LoopbackServer

__all__ = ["CertificateAuthority", "ServerCertificate", "TLSProxy"]

_CHUNK = 64 * 1024


@dataclass(frozen=True)
class ServerCertificate:
    """PEM files of a server certificate and its private key."""

    cert: Path
    key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _alt_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class CertificateAuthority:
    """A fresh CA for one test: its certificate is ``ca_file``; ``issue`` signs servers'.

    Args:
        directory: where the PEM files go (created if missing).
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._directory = directory
        now = datetime.datetime.now(datetime.UTC)
        self._start, self._end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=1)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = _name("tenure test CA")
        usage = x509.KeyUsage(
            digital_signature=True,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=True,
            crl_sign=True,
            encipher_only=False,
            decipher_only=False,
        )
        public = self._key.public_key()
        ca = (
            self._builder(self._name, public)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(usage, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_file = directory / "ca.pem"
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self._issued = 0

    def _builder(
        self, subject: x509.Name, public: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._start)
            .not_valid_after(self._end)
        )

    def issue(self, names: Sequence[str]) -> ServerCertificate:
        """A server certificate signed by this CA, valid for ``names`` (IPs or host names)."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            self._builder(_name(names[0]), key.public_key())
            .add_extension(x509.SubjectAlternativeName([_alt_name(n) for n in names]), False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), False
            )
            .sign(self._key, hashes.SHA256())
        )
        self._issued += 1
        paths = ServerCertificate(
            self._directory / f"server{self._issued}.pem",
            self._directory / f"server{self._issued}.key",
        )
        paths.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        paths.key.write_bytes(_pem_key(key))
        return paths


class TLSProxy(LoopbackServer):
    """Terminates TLS on a loopback port and forwards each connection to ``target``.

    Args:
        target: (host, port) of the plain redis-server behind it.
        certificate: the certificate (and key) it presents.
        handshake_delay: seconds each accepted connection waits before its handshake.

    ``handshakes`` counts completed handshakes, ``rejected`` the ones the client broke
    off (it did not accept the certificate).
    """

    def __init__(
        self,
        target: tuple[str, int],
        certificate: ServerCertificate,
        *,
        handshake_delay: float = 0.0,
    ) -> None:
        super().__init__()
        self.target = target
        self.handshake_delay = handshake_delay
        self.handshakes = 0
        self.rejected = 0
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(certificate.cert, certificate.key)
        self._closed = threading.Event()
        self._gate = threading.Event()
        self._gate.set()
        self._changed = threading.Condition()
        self._sockets: set[socket.socket] = set()
        self._spawn(self._accept)

    @property
    def url(self) -> str:
        """``rediss://`` URL of the proxy by its IP address."""
        return f"rediss://{HOST}:{self.port}"

    def hold(self) -> None:
        """Keep new connections waiting before their handshake until ``release()``."""
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def wait_handshakes(self, n: int, *, rejected: int = 0, timeout: float = 10.0) -> bool:
        """Wait until ``n`` handshakes completed and ``rejected`` were broken off, in all
        (False if ``timeout`` passed first)."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self.handshakes >= n and self.rejected >= rejected, timeout
            )

    def close(self) -> None:
        self._closed.set()
        self._gate.set()
        self._stop_listening()
        with self._changed:
            sockets, self._sockets = set(self._sockets), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._join()

    def __enter__(self) -> TLSProxy:
        return self

    def _track(self, sock: socket.socket) -> bool:
        with self._changed:
            if self._closed.is_set():
                return False
            self._sockets.add(sock)
            return True

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if not self._track(client):
                client.close()
                return
            self._spawn(self._serve, client)

    def _serve(self, client: socket.socket) -> None:
        with contextlib.ExitStack() as stack:
            stack.callback(client.close)
            if self.handshake_delay:
                self._closed.wait(self.handshake_delay)
            self._gate.wait()
            if self._closed.is_set():
                return
            # The handshake runs on the wrapped socket, which close() must be able to
            # shut down (wrapping detaches ``client``).
            tls = self._context.wrap_socket(client, server_side=True, do_handshake_on_connect=False)
            stack.callback(tls.close)
            if not self._track(tls):
                return
            try:
                tls.do_handshake()
            except (ssl.SSLError, OSError):
                with self._changed:
                    self.rejected += 1
                    self._changed.notify_all()
                return
            with self._changed:
                self.handshakes += 1
                self._changed.notify_all()
            try:
                backend = socket.create_connection(self.target)
            except OSError:
                return  # the node is down: the client sees the connection close
            stack.callback(backend.close)
            if self._track(backend):
                self._pump(tls, backend)

    def _pump(self, tls: ssl.SSLSocket, backend: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                readable, _, _ = select.select([tls, backend], [], [])
                for sock in readable:
                    if sock is tls:
                        data = tls.recv(_CHUNK)
                        while data and tls.pending():
                            data += tls.recv(tls.pending())
                        if not data:
                            return
                        backend.sendall(data)
                    else:
                        data = backend.recv(_CHUNK)
                        if not data:
                            return
                        tls.sendall(data)
