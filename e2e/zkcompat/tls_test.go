package zkcompat

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ZooKeeper's protocol over TLS (--zk-secure-listen, ZooKeeper's
// secureClientPort) with the clients' own TLS support: Kazoo's use_ssl,
// and ZooKeeper's Java client (Curator's) with its Netty socket; against
// Tenure and against ZooKeeper 3.8's own secureClientPort, with the same
// certificates and the same expectations.

// devClientID is ZooKeeper's x509 id of `tenure cert dev`'s client
// certificate: its subject, as RFC 2253 writes it.
const devClientID = "CN=tenure-dev-client"

// tlsServer is a ZooKeeper 3.8 or a single Tenure member serving
// ZooKeeper in plaintext and over TLS, with the certificates of `tenure
// cert dev` in certs.
type tlsServer struct {
	plain, secure string
	certs         string
}

func (s *tlsServer) cert(name string) string { return filepath.Join(s.certs, name) }

// startTLS runs target name; clientCA: client certificates are required
// on the TLS listener.
func startTLS(t *testing.T, name string, clientCA bool) *tlsServer {
	t.Helper()
	dir := t.TempDir()
	s := &tlsServer{certs: filepath.Join(dir, "certs")}
	if p := startProc(t, tenureBin(), "cert", "dev", "--dir", s.certs); p.wait(t, time.Minute) != 0 {
		t.Fatalf("tenure cert dev: %s", p.stderr())
	}
	if name == zooKeeper {
		startZooKeeperTLS(t, s, dir, clientCA)
		return s
	}
	args := []string{"serve", "-o", "json", "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0", "--http-listen", "",
		"--zk-listen", "127.0.0.1:0", "--zk-secure-listen", "127.0.0.1:0",
		"--tls-cert", s.cert("server.pem"), "--tls-key", s.cert("server-key.pem")}
	if clientCA {
		args = append(args, "--tls-client-ca", s.cert("ca.pem"))
	}
	p := startProc(t, tenureBin(), args...)
	waitFor(t, time.Minute, "tenure's ready line", func() bool {
		select {
		case <-p.done:
			t.Fatalf("tenure serve exited: %s", p.stderr())
		default:
		}
		var out struct {
			ZooKeeper       string `json:"zookeeper"`
			ZooKeeperSecure string `json:"zookeeper_secure"`
		}
		line, _, _ := strings.Cut(p.stdout(), "\n")
		if json.Unmarshal([]byte(line), &out) != nil || out.ZooKeeperSecure == "" {
			return false
		}
		s.plain, s.secure = out.ZooKeeper, out.ZooKeeperSecure
		return true
	})
	if err := (&server{Name: tenureT, Addr: s.plain, p: p}).waitReady(); err != nil {
		t.Fatal(err)
	}
	return s
}

// startZooKeeperTLS runs a standalone ZooKeeper 3.8 with a
// secureClientPort: Netty's connection factory, the certificates as PEM
// stores (the key store holds the key and the certificate), client
// certificates required (ZooKeeper's default) when clientCA, and the x509
// authentication provider, which makes a client certificate's subject the
// connection's x509 id.
func startZooKeeperTLS(t *testing.T, s *tlsServer, dir string, clientCA bool) {
	t.Helper()
	key, err := os.ReadFile(s.cert("server-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := os.ReadFile(s.cert("server.pem"))
	if err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(dir, "server-keystore.pem")
	if err := os.WriteFile(store, append(key, cert...), 0o600); err != nil {
		t.Fatal(err)
	}
	ps := ports(t, 2)
	clientAuth := "need"
	if !clientCA {
		clientAuth = "none"
	}
	cfg := fmt.Sprintf("tickTime=%d\ndataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\nsecureClientPort=%d\nsecureClientPortAddress=127.0.0.1\n"+
		"admin.enableServer=false\nminSessionTimeout=%d\nmaxSessionTimeout=%d\n"+
		"serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"+
		"ssl.keyStore.location=%s\nssl.keyStore.type=PEM\nssl.trustStore.location=%s\nssl.trustStore.type=PEM\nssl.clientAuth=%s\n"+
		"authProvider.x509=org.apache.zookeeper.server.auth.X509AuthenticationProvider\n",
		tickMs, filepath.Join(dir, "data"), ps[0], ps[1], minSessionMs, maxSessionMs, store, s.cert("ca.pem"), clientAuth)
	if err := os.WriteFile(filepath.Join(dir, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{}, jvmFlags...), "-Dzookeeper.jmx.log4j.disable=true",
		"-cp", nettyClasspath, "org.apache.zookeeper.server.ZooKeeperServerMain", filepath.Join(dir, "zoo.cfg"))
	p := startProc(t, "java", args...)
	s.plain, s.secure = fmt.Sprintf("127.0.0.1:%d", ps[0]), fmt.Sprintf("127.0.0.1:%d", ps[1])
	if err := (&server{Name: zooKeeper, Addr: s.plain, p: p}).waitReady(); err != nil {
		t.Fatal(err)
	}
}

// kazooTLS runs tls.py's case to its end; it must print "ok".
func kazooTLS(t *testing.T, hosts, root, kase string, args ...string) string {
	t.Helper()
	script, err := filepath.Abs("kazoo/tls.py")
	if err != nil {
		t.Fatal(err)
	}
	p := startProc(t, python, append([]string{script, hosts, root, kase}, args...)...)
	p.mustExit0(t, 2*time.Minute)
	if !strings.Contains(p.stdout(), "ok") {
		t.Fatalf("%s printed no ok: %s", kase, p.stdout())
	}
	return p.stdout()
}

// TestKazooTLS: Kazoo with use_ssl against --zk-secure-listen. With the
// server's certificate only, a client verifying it against the CA opens a
// session and writes. With --tls-client-ca, a client without a
// certificate never gets a session; one with a certificate is its x509
// id: a znode its ACL gives to that id alone is written by it and
// refused (NoAuth) to a plaintext client.
func TestKazooTLS(t *testing.T) {
	for _, name := range targets(t) {
		t.Run(name, func(t *testing.T) {
			t.Run("server certificate", func(t *testing.T) {
				s := startTLS(t, name, false)
				kazooTLS(t, s.secure, "/tls-connect", "connect", s.cert("ca.pem"))
			})
			t.Run("client certificates", func(t *testing.T) {
				s := startTLS(t, name, true)
				kazooTLS(t, s.secure, "/tls-refused", "refused", s.cert("ca.pem"))
				kazooTLS(t, s.secure, "/tls-x509", "x509", s.cert("ca.pem"), s.cert("client.pem"), s.cert("client-key.pem"), devClientID, s.plain)
			})
		})
	}
}

// javaTLSFlags are the system properties that make ZooKeeper's Java
// client (and Curator over it) speak TLS with the certificates of dir:
// the Netty socket, and PEM key and trust stores (the key store holds
// the key and the certificate).
func javaTLSFlags(t *testing.T, s *tlsServer) []string {
	t.Helper()
	key, err := os.ReadFile(s.cert("client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := os.ReadFile(s.cert("client.pem"))
	if err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(t.TempDir(), "client-keystore.pem")
	if err := os.WriteFile(store, append(key, cert...), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{
		"-Dzookeeper.clientCnxnSocket=org.apache.zookeeper.ClientCnxnSocketNetty",
		"-Dzookeeper.client.secure=true",
		"-Dzookeeper.ssl.keyStore.location=" + store, "-Dzookeeper.ssl.keyStore.type=PEM",
		"-Dzookeeper.ssl.trustStore.location=" + s.cert("ca.pem"), "-Dzookeeper.ssl.trustStore.type=PEM",
	}
}

// nettyClasspath adds to classpath the Netty jars ZooKeeper's Netty
// client socket needs beyond those zookeeper.jar's manifest names.
var nettyClasspath = classpath + ":" + javaDir + "/netty-resolver.jar:" + javaDir + "/netty-codec.jar"

// TestJavaClientTLS: ZooKeeper's Java client over TLS (Netty, a client
// certificate) against a TLS listener that requires client
// certificates: whoAmI (zkCli's whoami) names the certificate's x509 id,
// then the ip id, as ZooKeeper 3.8 lists them, and Curator's SharedCount
// recipe runs over it.
func TestJavaClientTLS(t *testing.T) {
	for _, name := range targets(t) {
		t.Run(name, func(t *testing.T) {
			s := startTLS(t, name, true)
			flags := javaTLSFlags(t, s)
			argv := append(append(append([]string{}, jvmFlags...), flags...), "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
				"-cp", nettyClasspath, "org.apache.zookeeper.ZooKeeperMain", "-server", s.secure, "whoami")
			p := startProc(t, "java", argv...)
			p.mustExit0(t, 2*time.Minute)
			if out := p.stdout(); !strings.Contains(out, "Auth scheme: User\nx509: "+devClientID+"\nip: 127.0.0.1\n") {
				t.Fatalf("whoami over TLS does not name x509 %s, then ip 127.0.0.1:\n%s", devClientID, out)
			}
			argv = append(append(append([]string{}, jvmFlags...), flags...), "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
				"-cp", nettyClasspath+":"+filepath.Join(bin, "classes"), "Recipes", s.secure, "/tls-curator", "shared-count")
			c := startProc(t, "java", argv...)
			c.mustExit0(t, 2*time.Minute)
			if !strings.Contains(c.stdout(), "ok") {
				t.Fatalf("Curator's SharedCount over TLS printed no ok: %s", c.stdout())
			}
		})
	}
}
