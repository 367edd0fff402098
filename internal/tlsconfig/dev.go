package tlsconfig

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority held in memory: for development
// certificates (`tenure cert dev`) and for tests.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// PEM is Cert in PEM form.
	PEM []byte
}

// Leaf is an issued certificate with its key, in PEM form.
type Leaf struct {
	CertPEM, KeyPEM []byte
}

// Usage says what an issued certificate may be used for.
type Usage int

const (
	// ServerAuth: a server's certificate (the client API).
	ServerAuth Usage = 1 << iota
	// ClientAuth: a client's certificate.
	ClientAuth
)

// NewCA makes a self-signed CA named name, valid for validity.
func NewCA(name string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Issue makes a certificate for commonName, valid for validity, with hosts
// (IP addresses or DNS names) as its subject alternative names.
func (ca *CA) Issue(commonName string, hosts []string, usage Usage, validity time.Duration) (Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Leaf{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if usage&ServerAuth != 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if usage&ClientAuth != 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return Leaf{}, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Leaf{}, err
	}
	return Leaf{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
	}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("tlsconfig: drawing a serial number: %v", err))
	}
	return n
}

// DevHosts are the names the development server and peer certificates
// are valid for.
var DevHosts = []string{"127.0.0.1", "::1", "localhost"}

// DevFiles are the files WriteDev writes, in the order it writes them.
var DevFiles = []string{"ca.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem", "peer.pem", "peer-key.pem"}

// DevClientName is the common name of the development client certificate
// (the identity `tenure acl identity` binds policies to).
const DevClientName = "tenure-dev-client"

// devValidity is how long development certificates are valid.
const devValidity = 90 * 24 * time.Hour

// WriteDev writes a throwaway CA and certificates signed by it into dir
// (created if needed): ca.pem; server.pem and server-key.pem for the
// client API; client.pem and client-key.pem (common name DevClientName);
// peer.pem and peer-key.pem for raft's mutual TLS. The server and peer
// certificates are valid for DevHosts. It refuses to overwrite any of
// them. The CA's own key is not written: nothing more can be signed by it.
func WriteDev(dir string) error {
	for _, f := range DevFiles {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return fmt.Errorf("%s exists; remove it or use another --dir", filepath.Join(dir, f))
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := NewCA("tenure development CA", devValidity)
	if err != nil {
		return err
	}
	server, err := ca.Issue("tenure-dev-server", DevHosts, ServerAuth, devValidity)
	if err != nil {
		return err
	}
	cl, err := ca.Issue(DevClientName, nil, ClientAuth, devValidity)
	if err != nil {
		return err
	}
	peer, err := ca.Issue("tenure-dev-peer", DevHosts, ServerAuth|ClientAuth, devValidity)
	if err != nil {
		return err
	}
	contents := [][]byte{ca.PEM, server.CertPEM, server.KeyPEM, cl.CertPEM, cl.KeyPEM, peer.CertPEM, peer.KeyPEM}
	for i, f := range DevFiles {
		mode := os.FileMode(0o644)
		if i%2 == 0 && i > 0 { // the keys
			mode = 0o600
		}
		if err := writeNew(filepath.Join(dir, f), contents[i], mode); err != nil {
			return err
		}
	}
	return nil
}

// writeNew writes a file that must not exist yet.
func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
