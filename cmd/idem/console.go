package main

// idem console: the command, its flags and its access tokens. The handler
// is in consoleserver.go, its pages in consolepages.go, the settle forms
// and their handler in consolesettle.go, the live view in consolelive.go.

import (
	"bytes"
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/idemgo/idem"
)

const consoleAbout = `Serves an operator's console for a store, in a browser: the quarantined
keys (each with its last attempt, its take-overs, its checkpoint and the
front door that wrote it), one key's record as idem inspect shows it,
settling a quarantined key (forget it, or confirm it with a result in the
form its front door replays: a Do value as JSON, an HTTP response, plain
bytes), and a live view of what the store can say cheaply (quarantined
keys, live claims that are take-overs, the round-trip time), sampled every
--every into a chart of the last --window.

Safe by default: it listens on 127.0.0.1 unless --listen says otherwise; it
prints at start a URL holding a random access token (the page then keeps
it in a cookie, not in the URL), or, with --token-file, takes its tokens
from a file of name:token lines (one per operator, each of at least 16
characters), so that every settle is logged with who made it. Every request
needs a token; every change is a POST carrying a CSRF token, and a
cross-origin POST is refused. Keys, checkpoints and results are shown by
their keyed hash (idem.KeyHasher: the secret of --key-hash-secret-file,
the one the service's KeyHasher uses, so that hashes match its logs;
otherwise a random one per start) unless --reveal: they may carry personal
data. --read-only shows everything and settles nothing. Each settle is a
line on stderr: who, what, and the key's hash.

The live counts cost the store little: on Redis a SCAN of at most --scan
keys (per master; the page says when the keyspace holds more), on SQL a
COUNT per figure over the expires_at index.`

// The console's defaults.
const (
	consoleListen = "127.0.0.1:8089"
	// consoleMaxKey bounds a key typed into the console: the stores'
	// default MaxKeyBytes.
	consoleMaxKey = 1024
	// consoleMinToken is the shortest token --token-file accepts.
	consoleMinToken = 16
)

//go:embed consoleweb
var consoleWeb embed.FS

func (c *cli) console(args []string) int {
	fs := flag.NewFlagSet("console", flag.ContinueOnError)
	var sf storeFlags
	sf.register(fs, c.getenv, kindsAll)
	listen := fs.String("listen", consoleListen, "the `HOST:PORT` to listen on (another host than loopback exposes the console: put TLS in front)")
	tokenFile := fs.String("token-file", "", "read the access tokens from `FILE`: name:token lines (default: one random token, printed)")
	secretFile := fs.String("key-hash-secret-file", "", "hash keys with the secret in `FILE` (the service's KeyHasher secret, a final line end dropped; default: random per start)")
	reveal := fs.Bool("reveal", false, "show keys, checkpoints and results as they are instead of their hash")
	readOnly := fs.Bool("read-only", false, "show, never settle")
	limit := fs.Int("limit", 200, "list at most `N` quarantined keys")
	every := fs.Duration("every", 5*time.Second, "sample the live view every `D`")
	window := fs.Duration("window", 15*time.Minute, "keep `D` of samples for the chart")
	scan := fs.Int("scan", 20000, "on Redis, count in at most `N` keys per master per sample")
	pos, done, st := c.parse(fs, args, "[store flags] [--listen HOST:PORT] [--token-file FILE] [--reveal] [--read-only]", consoleAbout+"\n\n"+envHelp(kindsAll))
	if done {
		return st
	}
	if len(pos) > 0 {
		return c.noArgs("console", pos)
	}
	switch {
	case *limit <= 0:
		return c.usageError("console", fmt.Errorf("--limit %d: give a positive number", *limit))
	case *every < 100*time.Millisecond:
		return c.usageError("console", fmt.Errorf("--every %v: give at least 100ms", *every))
	case *window < 2**every:
		return c.usageError("console", fmt.Errorf("--window %v: give at least two samples' worth (2 × --every)", *window))
	case *scan <= 0:
		return c.usageError("console", fmt.Errorf("--scan %d: give a positive number", *scan))
	}
	tokens := map[string]string{}
	var printed string
	if *tokenFile != "" {
		var err error
		if tokens, err = readTokenFile(*tokenFile); err != nil {
			return c.usageError("console", err)
		}
	} else {
		var b [24]byte
		_, _ = rand.Read(b[:])
		printed = hex.EncodeToString(b[:])
		tokens[printed] = "operator"
	}
	hasher := (*idem.KeyHasher)(nil)
	if *secretFile != "" {
		secret, err := os.ReadFile(*secretFile)
		if err != nil {
			return c.usageError("console", fmt.Errorf("--key-hash-secret-file: %w", err))
		}
		// The line end an editor or echo adds is not part of the secret
		// the service was given.
		secret = bytes.TrimSuffix(bytes.TrimSuffix(secret, []byte("\n")), []byte("\r"))
		if hasher, err = idem.NewKeyHasher(secret); err != nil {
			return c.usageError("console", fmt.Errorf("--key-hash-secret-file: %w", err))
		}
	}
	if err := c.chooseStore("console", fs, &sf); err != nil {
		return c.usageError("console", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b, err := sf.open(ctx, false, true)
	if err != nil {
		return c.fail("console", exitUsage, err)
	}
	defer b.close()
	b.allowEviction = true // it reads, and settles what a worker would
	s, err := b.store(idem.Options{})
	if err != nil {
		return c.usageError("console", err)
	}
	var counter liveCounter
	if b.isSQL() {
		counter = newSQLCounter(b.db, b.dialect, b.table)
	} else {
		counter = &redisCounter{c: b.redis, prefix: or(b.prefix, idem.DefaultPrefix), max: *scan}
	}
	con, err := newConsole(consoleConfig{
		Store: s, Desc: b.desc, Tokens: tokens, Hasher: hasher, Reveal: *reveal, ReadOnly: *readOnly,
		Limit: *limit, Live: newLiveView(counter, *every, *window), Log: c.stderr,
	})
	if err != nil {
		return c.usageError("console", err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return c.usageError("console", fmt.Errorf("--listen: %w", err))
	}
	go con.cfg.Live.run(ctx)
	srv := &http.Server{Handler: con, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second}
	base := "http://" + ln.Addr().String() + "/"
	mode := ""
	if *readOnly {
		mode = ", read-only"
	}
	if printed != "" {
		fmt.Fprintf(c.stdout, "idem console for %s%s: open %s?token=%s\n", b.desc, mode, base, printed)
	} else {
		fmt.Fprintf(c.stdout, "idem console for %s%s on %s (%d tokens from %s: open %s?token=YOUR-TOKEN)\n", b.desc, mode, base, len(tokens), *tokenFile, base)
	}
	if err := serveUntil(ctx, srv, ln); err != nil {
		return c.fail("console", exitFailed, err)
	}
	return exitOK
}

// readTokenFile reads name:token lines (blank lines and # comments
// skipped) into a map from token to name.
func readTokenFile(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--token-file: %w", err)
	}
	tokens := map[string]string{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, tok, ok := strings.Cut(line, ":")
		name, tok = strings.TrimSpace(name), strings.TrimSpace(tok)
		switch {
		case !ok || name == "":
			return nil, fmt.Errorf("--token-file %s line %d: want name:token", path, i+1)
		case len(tok) < consoleMinToken:
			return nil, fmt.Errorf("--token-file %s line %d: the token of %q has %d characters; give at least %d", path, i+1, name, len(tok), consoleMinToken)
		case tokens[tok] != "":
			return nil, fmt.Errorf("--token-file %s line %d: %q has the token of %q; give each its own", path, i+1, name, tokens[tok])
		}
		tokens[tok] = name
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("--token-file %s: no name:token line", path)
	}
	return tokens, nil
}

// consoleConfig is what a console serves and how.
type consoleConfig struct {
	Store  idem.Store // a Resolver too, to list and settle
	Desc   string     // the store, for the pages and the log
	Tokens map[string]string
	Hasher *idem.KeyHasher // nil: the process's random secret
	Reveal bool
	// ReadOnly refuses every settle.
	ReadOnly bool
	Limit    int       // the most quarantined keys a list shows
	Live     *liveView // sampled by the caller (run); nil: no live view
	Log      io.Writer // one line per settle
}
