"""Asks the control plane's CA for a workload certificate, as Istio's agent does.

Usage: csr.py ADDR SERVER_NAME ROOT_PEM KEY_TYPE TTL_SECONDS [--token FILE]
       [--clusterid ID] [--cert FILE --key FILE]

Builds a CSR with `cryptography` (KEY_TYPE rsa2048 or ecp256; the CSR names a host that
the CA must ignore), calls istio.v1.auth.IstioCertificateService/CreateCertificate over
TLS (the server verified against ROOT_PEM under SERVER_NAME), with the token as
`authorization: Bearer` and `clusterid` metadata, or with a client certificate; then
checks the returned chain with `cryptography` and prints one JSON line:
  {"ok": true, "sans": [...], "ttl": seconds, "chain": n, "leaf_matches_key": bool,
   "chain_verified": bool, "root_is_given_root": bool}
or {"ok": false, "code": "UNAUTHENTICATED", "details": "..."}.
The messages are encoded by hand: IstioCertificateRequest {csr = 1 (string),
validity_duration = 3 (int64)} and IstioCertificateResponse {cert_chain = 1 (repeated
string)}.
"""

import argparse
import json
import sys

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

METHOD = "/istio.v1.auth.IstioCertificateService/CreateCertificate"


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_request(csr_pem, ttl):
    data = csr_pem.encode()
    msg = b"\x0a" + varint(len(data)) + data
    if ttl:
        msg += b"\x18" + varint(ttl)
    return msg


def read_varint(buf, i):
    shift = 0
    n = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def decode_response(buf):
    chain = []
    i = 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 2:
            n, i = read_varint(buf, i)
            if field == 1:
                chain.append(buf[i : i + n].decode())
            i += n
        elif wire == 0:
            _, i = read_varint(buf, i)
        else:
            raise ValueError(f"unexpected wire type {wire}")
    return chain


def main():
    p = argparse.ArgumentParser()
    p.add_argument("addr")
    p.add_argument("server_name")
    p.add_argument("root")
    p.add_argument("key_type", choices=["rsa2048", "ecp256"])
    p.add_argument("ttl", type=int)
    p.add_argument("--token")
    p.add_argument("--clusterid")
    p.add_argument("--cert")
    p.add_argument("--key")
    a = p.parse_args()

    if a.key_type == "rsa2048":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    else:
        key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ignored")]))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("ignored.example.com")]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    csr_pem = csr.public_bytes(serialization.Encoding.PEM).decode()

    root_pem = open(a.root, "rb").read()
    cert_chain = open(a.cert, "rb").read() if a.cert else None
    private_key = open(a.key, "rb").read() if a.key else None
    creds = grpc.ssl_channel_credentials(
        root_certificates=root_pem, private_key=private_key, certificate_chain=cert_chain
    )
    options = [("grpc.ssl_target_name_override", a.server_name)]
    metadata = []
    if a.token:
        metadata.append(("authorization", "Bearer " + open(a.token).read().strip()))
    if a.clusterid:
        metadata.append(("clusterid", a.clusterid))
    with grpc.secure_channel(a.addr, creds, options=options) as channel:
        call = channel.unary_unary(
            METHOD, request_serializer=lambda m: m, response_deserializer=lambda b: b
        )
        try:
            raw = call(encode_request(csr_pem, a.ttl), metadata=metadata, timeout=10)
        except grpc.RpcError as e:
            print(json.dumps({"ok": False, "code": e.code().name, "details": e.details()}))
            return 0
    chain_pem = decode_response(raw)
    certs = [x509.load_pem_x509_certificate(c.encode()) for c in chain_pem]
    leaf = certs[0]
    sans = []
    try:
        ext = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        sans = [str(u) for u in ext.value.get_values_for_type(x509.UniformResourceIdentifier)]
        sans += ext.value.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        pass
    leaf_key = leaf.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    own_key = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # Each certificate is issued by the next; the last is the root we were given.
    verified = True
    try:
        for child, parent in zip(certs, certs[1:]):
            child.verify_directly_issued_by(parent)
    except Exception as e:  # noqa: BLE001 - report, do not crash
        print(f"chain verification: {e}", file=sys.stderr)
        verified = False
    given_root = x509.load_pem_x509_certificate(root_pem)
    ttl = (leaf.not_valid_after_utc - leaf.not_valid_before_utc).total_seconds()
    print(
        json.dumps(
            {
                "ok": True,
                "sans": sans,
                "ttl": ttl,
                "chain": len(certs),
                "leaf_matches_key": leaf_key == own_key,
                "chain_verified": verified,
                "root_is_given_root": certs[-1] == given_root,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
