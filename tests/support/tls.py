"""Test certificates and a TLS-terminating TCP proxy in front of a plain dev server.

The dev server cannot serve TLS; this proxy does what a load balancer in front of a
secured cluster does: it terminates TLS (ALPN `h2`, since gRPC runs over HTTP/2),
optionally requires a client certificate signed by its CA (mTLS), and forwards the
bytes to the plain frontend.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from boundloop.testing import free_port


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(directory: Path, stem: str, cert: x509.Certificate,
           key: ec.EllipticCurvePrivateKey) -> Pair:
    directory.mkdir(parents=True, exist_ok=True)
    pair = Pair(directory / f"{stem}.pem", directory / f"{stem}-key.pem")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    pair.key.chmod(0o600)  # a private key others may read is refused
    return pair


class CertificateAuthority:
    """A CA of its own that issues server and client certificates."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(_name(name))
                     .issuer_name(_name(name)).public_key(self.key.public_key())
                     .serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                     .add_extension(x509.KeyUsage(
                         digital_signature=True, key_cert_sign=True, crl_sign=True,
                         content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False,
                         encipher_only=False, decipher_only=False), True)
                     .add_extension(x509.SubjectKeyIdentifier.from_public_key(
                         self.key.public_key()), False)
                     .sign(self.key, hashes.SHA256()))
        self.pair = _write(directory, name, self.cert, self.key)

    def issue(self, stem: str, *, dns: list[str], client: bool) -> Pair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        if not client:
            names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        cert = (x509.CertificateBuilder().subject_name(_name(dns[0]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(names), False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
                .add_extension(x509.ExtendedKeyUsage([usage]), False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    self.key.public_key()), False)
                .sign(self.key, hashes.SHA256()))
        return _write(self.directory, stem, cert, key)


class TlsProxy:
    """TLS on 127.0.0.1:`port`, plain TCP to `target`, in a thread of its own (the
    processes it serves may block the test's event loop)."""

    def __init__(self, target: str, server: Pair, *, client_ca: Path | None) -> None:
        self.host, port = target.rsplit(":", 1)
        self.target_port = int(port)
        self.port = free_port()
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(server.cert, server.key)
        self.context.set_alpn_protocols(["h2"])
        if client_ca is not None:
            self.context.verify_mode = ssl.CERT_REQUIRED
            self.context.load_verify_locations(client_ca)
        self.handshakes = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> TlsProxy:
        self.thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", self.port, ssl=self.context),
            self.loop).result(timeout=10)
        return self

    def __exit__(self, *_: object) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    async def _handle(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        self.handshakes += 1  # start_server calls back after the TLS handshake
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer),
                             return_exceptions=True)
