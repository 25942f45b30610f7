package testenv

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // database/sql driver "mysql"
)

// MariaDBServer is a mariadbd of one test's own, on a free loopback port
// and a data directory of its own, which the test may kill and start again
// on both (a restart with crash recovery, as after a power cut).
type MariaDBServer struct {
	Addr string // host:port
	DSN  string // go-sql-driver/mysql's DSN of its database "idem", as root

	t    testing.TB
	args []string
	cmd  *exec.Cmd
}

// Debian's mariadb-server puts them there.
const (
	mariadbd         = "/usr/sbin/mariadbd"
	mariadbInstallDB = "mariadb-install-db"
)

// StartMariaDBServer creates a data directory, starts a mariadbd on it for
// t alone and waits until it answers; it is killed when t ends. Durability
// is the server's default (each commit flushed to the redo log), so what
// committed before a Kill is there after Start. Like the shared server, it
// is required under CI=true and skipped without IDEM_MYSQL_DSN, which says
// the machine has MariaDB.
func StartMariaDBServer(t testing.TB) *MariaDBServer {
	t.Helper()
	Lookup(t, MySQLDSNVar)
	dir := t.TempDir()
	// As root, mariadbd wants a user to run as; root itself, since the
	// test's temporary directory is private to it.
	var user []string
	if os.Geteuid() == 0 {
		user = []string{"--user=root"}
	}
	install := exec.Command(mariadbInstallDB, append([]string{"--no-defaults", "--datadir=" + filepath.Join(dir, "data"),
		"--auth-root-authentication-method=normal", "--skip-test-db"}, user...)...)
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", mariadbInstallDB, err, out)
	}
	port := FreePort(t)
	s := &MariaDBServer{t: t, Addr: "127.0.0.1:" + port,
		DSN: "root@tcp(127.0.0.1:" + port + ")/idem",
		args: append([]string{"--no-defaults", "--datadir=" + filepath.Join(dir, "data"),
			"--socket=" + filepath.Join(dir, "sock"), "--pid-file=" + filepath.Join(dir, "pid"),
			"--port=" + port, "--bind-address=127.0.0.1", "--skip-name-resolve", "--skip-log-bin",
			"--log-error=" + filepath.Join(dir, "log"), "--innodb-buffer-pool-size=32M"}, user...)}
	t.Cleanup(s.Kill)
	if !s.Start() {
		t.FailNow()
	}
	db, err := sql.Open("mysql", "root@tcp("+s.Addr+")/")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	if _, err := db.Exec("CREATE DATABASE idem"); err != nil {
		t.Fatalf("CREATE DATABASE idem: %v", err)
	}
	return s
}

// Start runs the server and waits until it answers (after a Kill, once its
// crash recovery is done). It reports failure with t.Errorf, not t.Fatalf,
// so that a goroutine other than the test's may restart a server, and
// returns whether the server answers.
func (s *MariaDBServer) Start() bool {
	s.t.Helper()
	s.cmd = exec.Command(mariadbd, s.args...)
	if err := s.cmd.Start(); err != nil {
		s.t.Errorf("starting mariadbd: %v", err)
		s.cmd = nil
		return false
	}
	db, err := sql.Open("mysql", "root@tcp("+s.Addr+")/?timeout=1s")
	if err != nil {
		s.t.Errorf("sql.Open: %v", err)
		return false
	}
	defer func() { _ = db.Close() }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := db.PingContext(ctx)
		cancel()
		if err == nil {
			return true
		}
		if time.Now().After(deadline) {
			s.t.Errorf("mariadbd on %s does not answer: %v", s.Addr, err)
			return false
		}
	}
}

// Kill sends SIGKILL, as a crash would, and reaps the process.
func (s *MariaDBServer) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}
