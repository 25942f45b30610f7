package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLS is a certificate authority of one test's own and a server
// certificate it signed for 127.0.0.1 and localhost, written as PEM files
// for a server to load, with the client configuration that trusts that CA
// alone: a client of it verifies the server, as a client of a real
// deployment must.
type TLS struct {
	CAFile, CertFile, KeyFile string
	// Client trusts the test's CA and nothing else.
	Client *tls.Config
}

// NewTLS makes a CA and a server certificate with crypto/x509 (no openssl)
// in t's temporary directory. They are valid for an hour.
func NewTLS(t testing.TB) *TLS {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	caKey := newKey(t)
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "idem test CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatalf("creating the test CA: %v", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	srvKey := newKey(t)
	srv := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "idem test server"},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatalf("creating the test server certificate: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	c := &TLS{CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "server.crt"), KeyFile: filepath.Join(dir, "server.key")}
	writePEM(t, c.CAFile, "CERTIFICATE", caDER)
	writePEM(t, c.CertFile, "CERTIFICATE", srvDER)
	writePEM(t, c.KeyFile, "PRIVATE KEY", keyDER)
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	c.Client = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	return c
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// StartTLS starts a server of this kind for t alone, as Start does, that
// listens with TLS only (tls-port; its plain port is off), with a
// certificate of NewTLS; clients need no certificate of their own. The
// server's TLS field holds the client configuration, which verifies it.
func (s Server) StartTLS(t testing.TB, extra ...string) *RedisServer {
	t.Helper()
	path := s.binary(t)
	c := NewTLS(t)
	port := FreePort(t)
	args := append([]string{"--port", "0", "--tls-port", port, "--tls-cert-file", c.CertFile,
		"--tls-key-file", c.KeyFile, "--tls-ca-cert-file", c.CAFile, "--tls-auth-clients", "no"}, extra...)
	srv := startServerTLS(t, path, port, c.Client, args...)
	s.check(t, srv.Options(), path+" with TLS")
	return srv
}
