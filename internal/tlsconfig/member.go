package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
)

// MemberServerName is the TLS server name a member dials another's client
// API with (MemberServer, MemberClient): to publish its own client address
// to the leader.
const MemberServerName = "tenure-member"

// MemberServer is the TLS configuration of a listener that members also
// dial: client, the listener's own, for clients; with peer TLS (peer not
// nil), a connection that names serverName gets peer's configuration
// instead, which requires a certificate of the peers' CA: a member.
func MemberServer(client *tls.Config, peer func() *tls.Config, serverName string) *tls.Config {
	if peer == nil {
		return client
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			if h.ServerName == serverName {
				return peer(), nil
			}
			if client.GetConfigForClient != nil {
				if c, err := client.GetConfigForClient(h); c != nil || err != nil {
					return c, err
				}
			}
			return client, nil
		},
	}
}

// MemberClient is the configuration a member dials host's listener with
// (MemberServer): its peer TLS settings, the server name serverName, and
// the server's certificate verified against the peers' CA for host.
func MemberClient(peer *tls.Config, host, serverName string) *tls.Config {
	c := peer.Clone()
	c.ServerName = serverName
	c.InsecureSkipVerify = true // verified below, for host rather than the server name sent
	roots := peer.RootCAs
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tlsconfig: the member presented no certificate")
		}
		opts := x509.VerifyOptions{Roots: roots, DNSName: host, Intermediates: x509.NewCertPool()}
		for _, ic := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(ic)
		}
		_, err := cs.PeerCertificates[0].Verify(opts)
		return err
	}
	return c
}
