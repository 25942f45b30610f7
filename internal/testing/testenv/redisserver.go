package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	mathrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/redisadmin"
)

// FreePort returns a loopback TCP port that nothing listened on when it was
// chosen: for a server a test starts, or for an address that must refuse
// connections. It is drawn from 18000-22767, so that it and a cluster
// node's bus port (+10000) lie below the kernel's range for the local
// ports of outgoing connections (32768-60999): a port the kernel chose
// (listening on port 0) can be any client connection's local port a
// moment later, and a server then cannot listen on it. The services of
// .ci/services.sh sit below 18000.
func FreePort(t testing.TB) string {
	t.Helper()
	const lo, n = 18000, 4768
	for range 200 {
		p := strconv.Itoa(lo + mathrand.IntN(n))
		l, err := net.Listen("tcp", "127.0.0.1:"+p)
		if err != nil {
			continue
		}
		_ = l.Close()
		return p
	}
	t.Fatalf("no free loopback port in %d-%d after 200 tries", lo, lo+n-1)
	return ""
}

// DeadRedis returns a client, closed when t ends, of a loopback address
// nothing listens on: every command fails at once with a dial error, never
// retried. It needs no service.
func DeadRedis(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + FreePort(t), MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// RedisServer is a redis-server of one test's own, on a free loopback port
// and a directory of its own, which the test may kill and start again on
// both.
type RedisServer struct {
	Addr string // host:port
	// TLS is the client configuration of a server that listens with TLS
	// (Server.StartTLS), which verifies it; nil for a plain one.
	TLS *tls.Config

	t      testing.TB
	bin    string
	args   []string
	dir    string // its directory: its log file
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited and been reaped
}

// StartRedisServer starts a redis-server for t alone (no RDB snapshots,
// extra arguments appended) and waits until it answers; it is killed when t
// ends. Like the shared Redis, it is required under CI=true and skipped
// without IDEM_REDIS_ADDR, which says the machine has Redis.
func StartRedisServer(t testing.TB, extra ...string) *RedisServer {
	t.Helper()
	return startRedisServer(t, FreePort(t), extra...)
}

// startRedisServer is StartRedisServer on port.
func startRedisServer(t testing.TB, port string, extra ...string) *RedisServer {
	t.Helper()
	Lookup(t, RedisAddrVar)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not on PATH: %v", err)
	}
	return startServer(t, bin, port, extra...)
}

// startServer is startRedisServer with the server binary bin (redis-server
// or a server that takes its arguments, such as valkey-server).
func startServer(t testing.TB, bin, port string, extra ...string) *RedisServer {
	t.Helper()
	return startServerTLS(t, bin, port, nil, append([]string{"--port", port}, extra...)...)
}

// startServerTLS is startServer for a server whose port the arguments set
// (a TLS server's tls-port), reached with the client configuration tc
// (nil: plain TCP).
func startServerTLS(t testing.TB, bin, port string, tc *tls.Config, args ...string) *RedisServer {
	t.Helper()
	for attempt := 1; ; attempt++ {
		dir := t.TempDir()
		s := &RedisServer{t: t, bin: bin, Addr: "127.0.0.1:" + port, TLS: tc, dir: dir,
			args: append([]string{"--bind", "127.0.0.1", "--save", "",
				"--dir", dir, "--logfile", filepath.Join(dir, "log")}, args...)}
		t.Cleanup(s.Kill)
		ok, taken := s.start()
		if ok {
			return s
		}
		if !taken || attempt == 3 {
			t.FailNow()
		}
		// Another test's server took the port between FreePort and this
		// start (many start at once): the same server on another port.
		next := FreePort(t)
		for i, a := range args {
			if a == port {
				args[i] = next
			}
		}
		port = next
	}
}

// Start runs the server and waits until it answers PING. It reports
// failure with t.Errorf, not t.Fatalf, so that a goroutine other than the
// test's may restart a server, and returns whether the server answers.
func (s *RedisServer) Start() bool {
	s.t.Helper()
	ok, taken := s.start()
	if taken {
		s.t.Errorf("redis-server on %s: another process answers on its port; this one could not listen there", s.Addr)
	}
	return ok
}

// start is Start; taken, without an error reported, says that the port
// is another process's: a server answered PING that is not this one (it
// could not listen and exited), which a caller may retry on another port.
func (s *RedisServer) start() (ok, taken bool) {
	s.t.Helper()
	s.cmd = exec.Command(s.bin, s.args...)
	if err := s.cmd.Start(); err != nil {
		s.t.Errorf("starting redis-server: %v", err)
		s.cmd = nil
		return false, false
	}
	cmd, exited := s.cmd, make(chan struct{})
	s.exited = exited
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	o := s.Options()
	o.MaxRetries = -1
	c := redis.NewClient(o)
	defer func() { _ = c.Close() }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		select {
		case <-exited:
			// It could not start: most often its port was taken (a
			// client's connection bound it as its local port, or
			// another test's server) after the port was chosen.
			s.cmd = nil
			log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
			if bytes.Contains(log, []byte("Address already in use")) {
				return false, true
			}
			s.t.Errorf("redis-server on %s exited at its start: %s", s.Addr, lastLines(log, 5))
			return false, false
		default:
		}
		err := c.Ping(context.Background()).Err()
		if err == nil {
			if pid, known := serverPID(c); known && pid != s.cmd.Process.Pid {
				s.Kill()
				return false, true
			}
			return true, false
		}
		if time.Now().After(deadline) {
			s.t.Errorf("redis-server on %s does not answer: %v", s.Addr, err)
			return false, false
		}
	}
}

// serverPID reads the process id of the server c reaches (INFO server's
// process_id); known is false when it cannot be read.
func serverPID(c *redis.Client) (pid int, known bool) {
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			n, err := strconv.Atoi(v)
			return n, err == nil
		}
	}
	return 0, false
}

// Options returns a client's options for the server: its address, and
// its TLS configuration if it has one.
func (s *RedisServer) Options() *redis.Options {
	return &redis.Options{Addr: s.Addr, TLSConfig: s.TLS}
}

// Kill sends SIGKILL, as a crash would, and reaps the process.
func (s *RedisServer) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// lastLines returns the last n lines of b, for an error message.
func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// UniquePrefix returns a Redis key prefix no other test uses, so that tests
// (and other packages' tests) can share one Redis.
func UniquePrefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "idemtest:" + hex.EncodeToString(b[:]) + ":"
}

// DeletePrefix unlinks every key that begins with prefix, on every master of
// a cluster. prefix must hold no glob characters.
func DeletePrefix(ctx context.Context, c redis.UniversalClient, prefix string) error {
	_, err := redisadmin.Unlink(ctx, c, prefix+"*")
	return err
}
