// Package tlsconfig builds the TLS configurations of a Tenure server: the
// client API's (a certificate, optionally a client CA whose certificates
// are then required) and the peers' (mutual TLS: a certificate that is
// both server and client, and the CA every peer's certificate must chain
// to). It also writes throwaway development certificates (dev.go).
//
// Certificates are re-read without a restart: every handshake first looks
// at the files' size and modification time and loads them again when
// either changed, and Reload (the server calls it on SIGHUP) loads them
// unconditionally. A change that does not load (a key that does not match
// its certificate, a half-written file) keeps the previous configuration
// and is reported on the log; the next handshake tries again once the
// files change again. Connections already made keep the certificates they
// were made with.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Files names the PEM files of one TLS configuration.
type Files struct {
	// Cert and Key are this side's certificate chain and its private key.
	Cert, Key string
	// CA is the certificate(s) the other side's certificate must chain
	// to: for a server, the client CA (client certificates are then
	// required and verified); for peers, the peers' CA (both directions).
	// Empty for a server: no client certificates are asked for.
	CA string
}

// Mode says which side a Reloader configures.
type Mode int

const (
	// Server is the client API's side: a certificate, and client
	// certificates required and verified when Files.CA is set.
	Server Mode = iota + 1
	// Peer is raft's mutual TLS: every connection, in either direction,
	// presents a certificate that chains to Files.CA and verifies the
	// other side's against it. Files.CA is required.
	Peer
)

// Reloader serves a TLS configuration from files and reloads it when they
// change. It is safe for concurrent use.
type Reloader struct {
	src   Files
	side  Mode
	log   io.Writer
	files []string // the files watched, in a fixed order

	// mu guards cur and stamps.
	mu     sync.Mutex
	cur    *tls.Config
	stamps []stamp
}

// stamp identifies one version of a file.
type stamp struct {
	size int64
	mod  time.Time
}

// New loads files for side; it fails if they do not load. log receives a
// line for every reload that fails (nil: discarded).
func New(files Files, side Mode, log io.Writer) (*Reloader, error) {
	switch {
	case files.Cert == "" || files.Key == "":
		return nil, errors.New("a TLS certificate needs both its certificate and its key file")
	case side == Peer && files.CA == "":
		return nil, errors.New("peer TLS needs the peers' CA file too (--peer-tls-ca)")
	case side != Server && side != Peer:
		return nil, fmt.Errorf("tlsconfig: unknown mode %d", side)
	}
	if log == nil {
		log = io.Discard
	}
	r := &Reloader{src: files, side: side, log: log, files: []string{files.Cert, files.Key}}
	if files.CA != "" {
		r.files = append(r.files, files.CA)
	}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload loads the files now. On error the previous configuration stays.
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.loadLocked()
}

// loadLocked reads every file and builds the configuration.
func (r *Reloader) loadLocked() error {
	stamps := make([]stamp, len(r.files))
	for i, f := range r.files {
		st, err := os.Stat(f)
		if err != nil {
			return fmt.Errorf("TLS file: %w", err)
		}
		stamps[i] = stamp{st.Size(), st.ModTime()}
	}
	r.stamps = stamps // a failed load is not retried until the files change again
	cert, err := tls.LoadX509KeyPair(r.src.Cert, r.src.Key)
	if err != nil {
		return fmt.Errorf("TLS certificate %s with key %s: %w", r.src.Cert, r.src.Key, err)
	}
	var pool *x509.CertPool
	if r.src.CA != "" {
		if pool, err = LoadPool(r.src.CA); err != nil {
			return err
		}
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	switch r.side {
	case Server:
		if pool != nil {
			c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
		}
	case Peer:
		// Both ends are Tenure servers: TLS 1.3 only, both certificates
		// verified against the peers' CA.
		c.MinVersion = tls.VersionTLS13
		c.ClientCAs, c.ClientAuth, c.RootCAs = pool, tls.RequireAndVerifyClientCert, pool
	}
	r.cur = c
	return nil
}

// changedLocked reports whether a watched file's size or modification
// time differs from the last load's.
func (r *Reloader) changedLocked() bool {
	for i, f := range r.files {
		st, err := os.Stat(f)
		if err != nil {
			return false // being replaced: keep what works
		}
		if (stamp{st.Size(), st.ModTime()}) != r.stamps[i] {
			return true
		}
	}
	return false
}

// Config returns the current configuration, reloading the files first if
// they changed. The caller must not modify it (Clone it to change it).
func (r *Reloader) Config() *tls.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.changedLocked() {
		if err := r.loadLocked(); err != nil {
			fmt.Fprintf(r.log, "tenure: TLS files changed but did not load, keeping the previous certificates: %v\n", err)
		}
	}
	return r.cur
}

// ServerConfig is a configuration for a listener (the gRPC server) that
// takes the current configuration at every handshake.
func (r *Reloader) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return r.Config(), nil },
	}
}

// LoadPool reads a PEM file of one or more CA certificates.
func LoadPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", file)
	}
	return pool, nil
}

// ClientConfig is the configuration of a client of the API (the CLI):
// caFile, if set, is the CA the server's certificate must chain to
// (otherwise the system's roots); certFile and keyFile, if set, are the
// client certificate presented to a server that asks for one.
func ClientConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := LoadPool(caFile)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	switch {
	case certFile != "" && keyFile != "":
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate %s with key %s: %w", certFile, keyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	case certFile != "" || keyFile != "":
		return nil, errors.New("a client certificate needs both --cert and --key")
	}
	return c, nil
}
