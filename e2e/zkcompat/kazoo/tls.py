"""Kazoo over TLS (ZooKeeper's secureClientPort), unmodified.

Usage: tls.py SECURE_HOSTS ROOT CASE CA [CERT KEY [ARGS...]]

  connect  a session over TLS: create ROOT, write and read it back.
  refused  without a client certificate the session is never opened.
  x509     ARGS: X509_ID PLAIN_HOSTS. The certificate is the session's
           x509 id: ROOT is created writable by that id only (readable by
           anyone); the client writes it; a plaintext client on
           PLAIN_HOSTS is refused (NoAuth).

Prints "ok" when every check held; exits non-zero otherwise.
"""

import sys

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_acl

HOSTS, ROOT, CASE, CA = sys.argv[1:5]
CERT, KEY = (sys.argv[5], sys.argv[6]) if len(sys.argv) > 6 else (None, None)
ARGS = sys.argv[7:]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def tls_client(timeout=10.0):
    return KazooClient(hosts=HOSTS, timeout=timeout, use_ssl=True, ca=CA,
                       certfile=CERT, keyfile=KEY)


if CASE == "connect":
    zk = tls_client()
    zk.start(timeout=20)
    zk.create(ROOT, b"v1")
    zk.set(ROOT, b"v2")
    data, stat = zk.get(ROOT)
    check(data == b"v2" and stat.version == 1, "read back %r %r" % (data, stat))
    zk.stop()
elif CASE == "refused":
    zk = tls_client()
    try:
        zk.start(timeout=5)
    except Exception as e:  # the handshake fails: no session, ever
        print("refused: %s" % type(e).__name__)
    else:
        raise AssertionError("a client without a certificate got a session")
    finally:
        zk.stop()
elif CASE == "x509":
    x509_id, plain_hosts = ARGS
    zk = tls_client()
    zk.start(timeout=20)
    acl = [make_acl("x509", x509_id, all=True), make_acl("world", "anyone", read=True)]
    zk.create(ROOT, b"mine", acl=acl)
    zk.set(ROOT, b"still mine")
    got, _ = zk.get_acls(ROOT)
    check(any(a.id.scheme == "x509" and a.id.id == x509_id for a in got), "acl %r" % (got,))
    other = KazooClient(hosts=plain_hosts, timeout=10.0)
    other.start(timeout=20)
    try:
        other.set(ROOT, b"theirs")
    except NoAuthError:
        pass
    else:
        raise AssertionError("a client without the certificate wrote the node")
    data, _ = other.get(ROOT)
    check(data == b"still mine", "data %r" % (data,))
    other.stop()
    zk.stop()
else:
    raise SystemExit("no case " + CASE)
print("ok")
