package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/idemgo/idem"
)

const inspectAbout = `Shows the live record of one key: its state (claimed: a lease is held;
confirmed: the work is done), the owner of a live claim, the fencing token,
when the lease or the retention ends, the fingerprint (hex) and the size of
the stored result. A key without a live record (never claimed, forgotten, or
expired) exits 1. KEY is the store key as given to Claim; the middleware's
keys look like h1<len>:<scope><len>:<method><len>:<route><len>:<client key>,
e.g. 'h10:4:POST14:POST /payments5:pay-1'. --hex reads KEY as hex, for keys
that are not text. Expiry is the store's answer converted to this machine's
clock: an estimate.`

// inspection is inspect's --json output: one object, stable field names.
type inspection struct {
	Key         string    `json:"key"`
	State       string    `json:"state"` // "claimed" or "confirmed"
	Owner       string    `json:"owner"` // "" once confirmed
	Token       int64     `json:"token"`
	Expires     time.Time `json:"expires"`
	Fingerprint string    `json:"fingerprint"` // hex; "" for none
	ResultBytes int       `json:"result_bytes"`
}

func (c *cli) inspect(args []string) int {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	var sf storeFlags
	sf.register(fs, c.getenv, true)
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	asHex := fs.Bool("hex", false, "KEY is hex-encoded")
	pos, done, st := c.parse(fs, args, "[store flags] [--json] KEY", inspectAbout+"\n\n"+envHelp)
	if done {
		return st
	}
	if len(pos) != 1 {
		return c.usageError("inspect", fmt.Errorf("want exactly one KEY, got %d arguments", len(pos)))
	}
	key := pos[0]
	if *asHex {
		k, err := hex.DecodeString(key)
		if err != nil {
			return c.usageError("inspect", fmt.Errorf("--hex: %w", err))
		}
		key = string(k)
	}
	ctx := context.Background()
	b, err := sf.open(ctx, false, true)
	if err != nil {
		return c.fail("inspect", exitUsage, err)
	}
	defer b.close()
	b.allowEviction = true
	s, err := b.store(idem.Options{})
	if err != nil {
		return c.usageError("inspect", err)
	}
	r, err := s.Lookup(ctx, key)
	if errors.Is(err, idem.ErrNotFound) {
		return c.fail("inspect", exitFailed, fmt.Errorf("key %s has no live record in %s (never claimed, forgotten, or expired)", quoteKey(key), b.desc))
	}
	if err != nil {
		return c.fail("inspect", exitFailed, err)
	}
	in := newInspection(r)
	if *asJSON {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(in); err != nil {
			return c.fail("inspect", exitFailed, err)
		}
		return exitOK
	}
	writeInspection(c.stdout, in, time.Now())
	return exitOK
}

func newInspection(r *idem.Record) inspection {
	in := inspection{
		Key: r.Key, State: "claimed", Owner: r.Owner, Token: r.Token,
		Expires: r.Expires.UTC(), Fingerprint: hex.EncodeToString(r.Fingerprint), ResultBytes: len(r.Result),
	}
	if r.Confirmed {
		in.State = "confirmed"
	}
	return in
}

// writeInspection writes in as aligned text; now dates the expiry.
func writeInspection(w io.Writer, in inspection, now time.Time) {
	row := func(name, v string) { fmt.Fprintf(w, "%-12s %s\n", name, v) }
	row("key", quoteKey(in.Key))
	row("state", in.State)
	row("owner", or(in.Owner, "-"))
	row("token", strconv.FormatInt(in.Token, 10))
	what := "lease ends"
	if in.State == "confirmed" {
		what = "retention ends"
	}
	row("expires", fmt.Sprintf("%s (%s in %v)", in.Expires.Format(time.RFC3339Nano), what, in.Expires.Sub(now).Round(time.Millisecond)))
	row("fingerprint", or(in.Fingerprint, "-"))
	row("result", fmt.Sprintf("%d bytes", in.ResultBytes))
}

// quoteKey prints a key as is when it is plain text, quoted otherwise, so
// that a key with control bytes cannot garble the terminal.
func quoteKey(k string) string {
	if utf8.ValidString(k) && strconv.Quote(k) == `"`+k+`"` {
		return k
	}
	return strconv.Quote(k)
}
